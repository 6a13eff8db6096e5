package sim

import (
	"fmt"
	"math"
	"regexp"
	"sort"
	"strings"

	"github.com/physd/physd/strictyaml"
	"gopkg.in/yaml.v3"
)

// plantConfig is the bus entry (buses.<name>) minus its type key.
type plantConfig struct {
	Seed        *int64                  `yaml:"seed"`
	LatencyMS   *int64                  `yaml:"latency_ms"`
	SensorNoise *float64                `yaml:"sensor_noise"`
	Zones       map[string]*zoneConfig  `yaml:"zones"`
	Tanks       map[string]*tankConfig  `yaml:"tanks"`
	Valves      map[string]*valveConfig `yaml:"valves"`
}

type zoneConfig struct {
	AmbientC     *float64 `yaml:"ambient_c"`
	InitialC     *float64 `yaml:"initial_c"`
	InitialRH    *float64 `yaml:"initial_rh"`
	TauS         *float64 `yaml:"tau_s"`
	HeaterGainC  *float64 `yaml:"heater_gain_c"`
	FanCoolingC  *float64 `yaml:"fan_cooling_c"`
	VentCoolingC *float64 `yaml:"vent_cooling_c"`
	AmbientRH    *float64 `yaml:"ambient_rh"`
}

type tankConfig struct {
	CapacityL *float64 `yaml:"capacity_l"`
	InitialL  *float64 `yaml:"initial_l"`
	InflowLPM *float64 `yaml:"inflow_lpm"`
}

type valveConfig struct {
	TravelMS *int64   `yaml:"travel_ms"`
	FlowLPM  *float64 `yaml:"flow_lpm"`
	Drains   *string  `yaml:"drains"`
	Initial  *float64 `yaml:"initial"`
}

// bindingParams are the structured binding keys a sim binding accepts.
type bindingParams struct {
	Point *string `yaml:"point"`
}

// Defaults.
const (
	defaultAmbientC     = 12.0
	defaultInitialRH    = 75.0
	defaultAmbientRH    = 60.0
	defaultTauS         = 600.0
	defaultHeaterGainC  = 15.0
	defaultFanCoolingC  = 2.0
	defaultVentCoolingC = 5.0
	defaultCapacityL    = 1000.0
	defaultTravelMS     = 4000
	defaultFlowLPM      = 10.0
	defaultSensorNoise  = 1.0
	maxLatencyMS        = 60_000
)

type zoneSpec struct {
	name                                      string
	ambientC, initialC, initialRH, ambientRH  float64
	tauS, heaterGainC, fanCoolingC, ventCoolC float64
}

type tankSpec struct {
	name                           string
	capacityL, initialL, inflowLPM float64
}

type valveSpec struct {
	name     string
	travelMS int64
	flowLPM  float64
	drains   string // tank name, or ""
	initial  float64
}

type plantSpec struct {
	seed        int64
	latencyMS   int64
	sensorNoise float64
	zones       []zoneSpec
	tanks       []tankSpec
	valves      []valveSpec
}

var nameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// parseConfig decodes (strictly, with strictyaml.Decode) and validates a
// sim bus entry. root is the field path, e.g. "buses.plant". A nil or empty
// node gives the default plant.
func parseConfig(file, root string, n *yaml.Node) (*plantSpec, error) {
	n = strictyaml.WithoutKey(n, "type") // tolerate type: left in Config
	var cfg plantConfig
	if errs := strictyaml.Decode(file, n, root, &cfg); len(errs) > 0 {
		return nil, errs
	}
	pp := &plantParser{v: &validator{strictyaml.Problems{File: file, Root: root, Top: n, KeyFallback: true}}, cfg: &cfg, seen: map[string]string{},
		spec: &plantSpec{sensorNoise: defaultSensorNoise}}
	pp.plant()
	if cfg.Zones == nil && cfg.Tanks == nil && cfg.Valves == nil {
		// Nothing declared: the default greenhouse (three zones, a tank, a valve).
		cfg.Zones = map[string]*zoneConfig{"zone_a": nil, "zone_b": nil, "zone_c": nil}
		cfg.Tanks = map[string]*tankConfig{"rain_tank": nil}
		drains := "rain_tank"
		cfg.Valves = map[string]*valveConfig{"irrigation_a": {Drains: &drains}}
	}
	pp.zones()
	pp.tanks()
	pp.valves()
	if pp.v.Len() > 0 {
		return nil, pp.v.Errs
	}
	return pp.spec, nil
}

// plantParser validates a decoded plant section by section into spec.
type plantParser struct {
	v         *validator
	cfg       *plantConfig
	spec      *plantSpec
	seen      map[string]string // object name -> its section
	tankNames []string          // in source order
}

// plant reads the plant-wide keys: seed, latency_ms, sensor_noise.
func (pp *plantParser) plant() {
	cfg, spec, v := pp.cfg, pp.spec, pp.v
	if cfg.Seed != nil {
		spec.seed = *cfg.Seed
	}
	if cfg.LatencyMS != nil {
		spec.latencyMS = *cfg.LatencyMS
		if spec.latencyMS < 0 || spec.latencyMS > maxLatencyMS {
			v.Add(fmt.Sprintf("latency_ms must be between 0 and %d, got %d", maxLatencyMS, spec.latencyMS),
				"use 0 for instant reads and writes, or a small delay such as 20", "latency_ms")
		}
	}
	if cfg.SensorNoise != nil {
		spec.sensorNoise = *cfg.SensorNoise
		v.between(spec.sensorNoise, 0, 100, "0 for exact sensors, 1 for the default noise", "sensor_noise")
	}
}

// checkName reports a name that is not a valid identifier, or that another
// zone, tank or valve of the plant already has.
func (pp *plantParser) checkName(section, name string) {
	if !nameRE.MatchString(name) {
		pp.v.AddKey(fmt.Sprintf("invalid name %q", name),
			"use letters, digits, _ and - only (no dots), starting with a letter or _", section, name)
	}
	if other, dup := pp.seen[name]; dup {
		pp.v.AddKey(fmt.Sprintf("name %q is already used in %s", name, other),
			"give every zone, tank and valve of a plant a distinct name", section, name)
	}
	pp.seen[name] = section
}

func (pp *plantParser) zones() {
	v := pp.v
	for _, name := range v.order(pp.cfg.Zones, "zones") {
		pp.checkName("zones", name)
		c := pp.cfg.Zones[name]
		if c == nil {
			c = &zoneConfig{}
		}
		z := zoneSpec{
			name:        name,
			ambientC:    orDefault(c.AmbientC, defaultAmbientC),
			initialRH:   orDefault(c.InitialRH, defaultInitialRH),
			ambientRH:   orDefault(c.AmbientRH, defaultAmbientRH),
			tauS:        orDefault(c.TauS, defaultTauS),
			heaterGainC: orDefault(c.HeaterGainC, defaultHeaterGainC),
			fanCoolingC: orDefault(c.FanCoolingC, defaultFanCoolingC),
			ventCoolC:   orDefault(c.VentCoolingC, defaultVentCoolingC),
		}
		z.initialC = orDefault(c.InitialC, z.ambientC)
		at := func(key string) []string { return []string{"zones", name, key} }
		v.between(z.ambientC, -50, 80, "an outside air temperature in °C, e.g. 12", at("ambient_c")...)
		v.between(z.initialC, -50, 80, "a starting air temperature in °C, e.g. 18", at("initial_c")...)
		v.between(z.initialRH, 0, 100, "a relative humidity in percent, e.g. 70", at("initial_rh")...)
		v.between(z.ambientRH, 0, 100, "a relative humidity in percent, e.g. 60", at("ambient_rh")...)
		v.positive(z.tauS, "the thermal time constant in seconds, e.g. 600", at("tau_s")...)
		v.between(z.heaterGainC, 0, 200, "°C added at steady state by the heater at 100 %, e.g. 15", at("heater_gain_c")...)
		v.between(z.fanCoolingC, 0, 200, "°C removed at steady state by the fan at 100 %, e.g. 2", at("fan_cooling_c")...)
		v.between(z.ventCoolC, 0, 200, "°C removed at steady state by the vent at 100 %, e.g. 5", at("vent_cooling_c")...)
		pp.spec.zones = append(pp.spec.zones, z)
	}
}

func (pp *plantParser) tanks() {
	v := pp.v
	pp.tankNames = v.order(pp.cfg.Tanks, "tanks")
	for _, name := range pp.tankNames {
		pp.checkName("tanks", name)
		c := pp.cfg.Tanks[name]
		if c == nil {
			c = &tankConfig{}
		}
		t := tankSpec{
			name:      name,
			capacityL: orDefault(c.CapacityL, defaultCapacityL),
			inflowLPM: orDefault(c.InflowLPM, 0),
		}
		t.initialL = orDefault(c.InitialL, t.capacityL/2)
		at := func(key string) []string { return []string{"tanks", name, key} }
		if v.positive(t.capacityL, "the tank volume in litres, e.g. 2000", at("capacity_l")...) {
			v.between(t.initialL, 0, t.capacityL,
				fmt.Sprintf("a starting level between 0 and capacity_l (%g)", t.capacityL), at("initial_l")...)
		}
		v.between(t.inflowLPM, 0, 1e6, "litres per minute flowing in, e.g. 0.5 (0 for none)", at("inflow_lpm")...)
		pp.spec.tanks = append(pp.spec.tanks, t)
	}
}

// valves reads the valves; it runs after tanks, whose names drains: takes.
func (pp *plantParser) valves() {
	v := pp.v
	for _, name := range v.order(pp.cfg.Valves, "valves") {
		pp.checkName("valves", name)
		c := pp.cfg.Valves[name]
		if c == nil {
			c = &valveConfig{}
		}
		vs := valveSpec{
			name:     name,
			travelMS: defaultTravelMS,
			flowLPM:  orDefault(c.FlowLPM, defaultFlowLPM),
			initial:  orDefault(c.Initial, 0),
		}
		at := func(key string) []string { return []string{"valves", name, key} }
		if c.TravelMS != nil {
			vs.travelMS = *c.TravelMS
			if vs.travelMS <= 0 {
				v.Add(fmt.Sprintf("travel_ms must be > 0, got %d", vs.travelMS),
					"use the time in milliseconds the valve takes from closed to fully open, e.g. 4000", at("travel_ms")...)
			}
		}
		v.between(vs.flowLPM, 0, 1e6, "litres per minute at 100 % open, e.g. 20", at("flow_lpm")...)
		v.between(vs.initial, 0, 100, "a starting opening in percent, 0..100", at("initial")...)
		if c.Drains != nil {
			vs.drains = *c.Drains
			if _, ok := pp.cfg.Tanks[vs.drains]; !ok {
				fix := "declare the tank under tanks:, or remove drains"
				if len(pp.tankNames) > 0 {
					fix = "name one of the tanks: " + strings.Join(pp.tankNames, ", ")
				}
				v.Add(fmt.Sprintf("drains names unknown tank %q", vs.drains), fix, at("drains")...)
			}
		}
		pp.spec.valves = append(pp.spec.valves, vs)
	}
}

func orDefault(p *float64, def float64) float64 {
	if p == nil {
		return def
	}
	return *p
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// validator reports semantic problems of a decoded config at the position
// of the offending text in the source node: Add at the value at a path (or
// the nearest key written, for a default), AddKey at the key.
type validator struct {
	strictyaml.Problems
}

func (v *validator) between(x, lo, hi float64, fix string, path ...string) bool {
	if !finite(x) || x < lo || x > hi {
		v.Add(fmt.Sprintf("%s must be between %g and %g, got %v", path[len(path)-1], lo, hi, x), "use "+fix, path...)
		return false
	}
	return true
}

func (v *validator) positive(x float64, fix string, path ...string) bool {
	if !finite(x) || x <= 0 {
		v.Add(fmt.Sprintf("%s must be > 0, got %v", path[len(path)-1], x), "use "+fix, path...)
		return false
	}
	return true
}

// order returns the keys of section in source order, or sorted when the
// section was not written (defaults).
func (v *validator) order(m any, section string) []string {
	if _, n := strictyaml.Lookup(v.Top, section); n != nil && n.Kind == yaml.MappingNode {
		keys := make([]string, 0, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			keys = append(keys, n.Content[i].Value)
		}
		return keys
	}
	var keys []string
	switch m := m.(type) {
	case map[string]*zoneConfig:
		for k := range m {
			keys = append(keys, k)
		}
	case map[string]*tankConfig:
		for k := range m {
			keys = append(keys, k)
		}
	case map[string]*valveConfig:
		for k := range m {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}
