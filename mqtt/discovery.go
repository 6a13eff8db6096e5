package mqtt

import (
	"slices"
	"strings"

	"github.com/physd/physd/manifest"
)

// Sensor is a Home Assistant MQTT discovery config of a sensor (or, for a
// bool, a binary_sensor).
type Sensor struct {
	Name     string `json:"name"`
	UniqueID string `json:"unique_id"`
	// DefaultEntityID is sensor.<device_id>_<name> (Home Assistant
	// replaced object_id with it in 2025.10 and dropped object_id in 2026.4).
	DefaultEntityID     string   `json:"default_entity_id"`
	StateTopic          string   `json:"state_topic"`
	ValueTemplate       string   `json:"value_template"`
	JSONAttributesTopic string   `json:"json_attributes_topic"`
	Unit                string   `json:"unit_of_measurement,omitempty"`
	DeviceClass         string   `json:"device_class,omitempty"`
	StateClass          string   `json:"state_class,omitempty"`
	Options             []string `json:"options,omitempty"`
	// PayloadOn and PayloadOff are set for a bool (a binary_sensor):
	// the value template renders the value as ON or OFF.
	PayloadOn           string `json:"payload_on,omitempty"`
	PayloadOff          string `json:"payload_off,omitempty"`
	AvailabilityTopic   string `json:"availability_topic"`
	PayloadAvailable    string `json:"payload_available"`
	PayloadNotAvailable string `json:"payload_not_available"`
	Device              Device `json:"device"`
	Origin              Origin `json:"origin"`
}

// Device groups a gateway's sensors in Home Assistant.
type Device struct {
	Identifiers   []string `json:"identifiers"`
	Name          string   `json:"name"`
	Manufacturer  string   `json:"manufacturer,omitempty"`
	Model         string   `json:"model,omitempty"`
	SWVersion     string   `json:"sw_version,omitempty"`
	SuggestedArea string   `json:"suggested_area,omitempty"`
}

// Origin names the publisher.
type Origin struct {
	Name string `json:"name"`
}

// Discovery is the discovery config of a read_ capability.
func (p *Publisher) Discovery(c *manifest.Capability) Sensor {
	p.mu.Lock()
	m := p.m
	p.mu.Unlock()
	return p.sensor(m, c)
}

// sensor is the discovery config of c, a read_ capability of m.
func (p *Publisher) sensor(m *manifest.Manifest, c *manifest.Capability) Sensor {
	tool := c.ToolName()
	d := m.Device
	s := Sensor{
		Name:                strings.ReplaceAll(c.Name, "_", " "),
		UniqueID:            "physd_" + d.ID + "_" + tool,
		DefaultEntityID:     "sensor." + d.ID + "_" + c.Name,
		StateTopic:          p.StateTopic(tool),
		ValueTemplate:       "{{ value_json.value }}",
		JSONAttributesTopic: p.StateTopic(tool),
		AvailabilityTopic:   p.AvailabilityTopic(),
		PayloadAvailable:    "online",
		PayloadNotAvailable: "offline",
		Device: Device{Identifiers: []string{"physd_" + d.ID}, Name: d.ID, Manufacturer: d.Vendor,
			Model: strings.TrimSpace(d.Model + " " + d.Type), SWVersion: d.FirmwareVersion, SuggestedArea: d.Location.Zone},
		Origin: Origin{Name: "physd"},
	}
	if s.Device.Manufacturer == "" {
		s.Device.Manufacturer = "physd"
	}
	switch c.DataType {
	case "float", "int":
		s.Unit, s.DeviceClass = unitClass(c.Unit, c.SemanticTags)
		s.StateClass = "measurement"
	case "enum":
		s.DeviceClass, s.Options = "enum", c.EnumValues
	case "bool":
		s.DefaultEntityID = "binary_sensor." + d.ID + "_" + c.Name
		s.ValueTemplate = "{{ 'ON' if value_json.value else 'OFF' }}"
		s.PayloadOn, s.PayloadOff = "ON", "OFF"
	}
	return s
}

// component is the Home Assistant entity type of a read_ capability:
// binary_sensor for a bool, sensor otherwise.
func component(c *manifest.Capability) string {
	if c.DataType == "bool" {
		return "binary_sensor"
	}
	return "sensor"
}

// unitClass maps a manifest unit to Home Assistant's unit and, where it is
// obvious, its device class.
func unitClass(unit string, tags []string) (string, string) {
	has := func(t ...string) bool {
		for _, x := range t {
			if slices.Contains(tags, x) {
				return true
			}
		}
		return false
	}
	switch strings.ToLower(unit) {
	case "celsius", "degc", "°c", "c":
		return "°C", "temperature"
	case "fahrenheit", "degf", "°f":
		return "°F", "temperature"
	case "kelvin":
		return "K", "temperature"
	case "percent", "%":
		switch {
		case has("humidity"):
			return "%", "humidity"
		case has("moisture", "soil_moisture"):
			return "%", "moisture"
		case has("battery"):
			return "%", "battery"
		}
		return "%", ""
	case "pa":
		return "Pa", "pressure"
	case "hpa":
		return "hPa", "pressure"
	case "kpa":
		return "kPa", "pressure"
	case "bar":
		return "bar", "pressure"
	case "w", "watt":
		return "W", "power"
	case "kw":
		return "kW", "power"
	case "kwh":
		return "kWh", "energy"
	case "v", "volt":
		return "V", "voltage"
	case "a", "ampere":
		return "A", "current"
	case "lx", "lux":
		return "lx", "illuminance"
	case "ppm":
		if has("co2") {
			return "ppm", "carbon_dioxide"
		}
		return "ppm", ""
	case "litre", "liter", "l":
		return "L", "volume"
	case "hour", "h":
		return "h", "duration"
	case "s", "second":
		return "s", "duration"
	case "1", "":
		return "", ""
	}
	return unit, ""
}
