package modbus

import (
	"fmt"
	"strings"

	"github.com/physd/physd/profiles"
	"github.com/physd/physd/strictyaml"
)

// applyProfile fills a binding's register keys from a device profile
// (profile: <name>, point: <point>; package profiles). The profile sets
// table, address, data_type, byte_order, bit, scale and offset; saying any
// of them again in the binding is an error, so a manifest never silently
// disagrees with its profile. unit, write_function, enum_map and verify
// stay the binding's. It reports false after adding a problem.
func applyProfile(p *strictyaml.Problems, k *bindingKeys, do bool) (*profiles.ModbusPoint, bool) {
	if k.Profile == nil {
		if k.Point != nil {
			p.Add("point: names a point of a device profile, but the binding has no profile:",
				"add profile: <name> ("+strings.Join(profiles.ModbusNames(), ", ")+"), or remove point:", "point")
			return nil, false
		}
		return nil, true
	}
	name := strings.TrimSpace(*k.Profile)
	prof, err := profiles.LoadModbus(name)
	if err != nil {
		p.Add(err.Error(), "use one of the Modbus profiles in the library: "+strings.Join(profiles.ModbusNames(), ", "), "profile")
		return nil, false
	}
	if k.Point == nil {
		p.Add(fmt.Sprintf("profile %s needs point: to say which of its values this capability is", name),
			"add point: with one of "+strings.Join(prof.PointNames(), ", "), "profile")
		return nil, false
	}
	pt := prof.Points[strings.TrimSpace(*k.Point)]
	if pt == nil {
		p.Add(fmt.Sprintf("profile %s (%s %s) has no point %q", name, prof.Vendor, prof.Model, *k.Point),
			"use one of its points: "+strings.Join(prof.PointNames(), ", "), "point")
		return nil, false
	}
	ok := true
	for _, c := range []struct {
		key string
		set bool
	}{{"table", k.Table != nil}, {"data_type", k.DataType != nil}, {"byte_order", k.ByteOrder != nil},
		{"bit", k.Bit != nil}, {"scale", k.Scale != nil}, {"offset", k.Offset != nil}} {
		if c.set {
			p.Add(fmt.Sprintf("%s is set by profile %s point %s", c.key, name, pt.Name),
				fmt.Sprintf("remove %s: (or drop profile: and point: and bind the register by hand)", c.key), c.key)
			ok = false
		}
	}
	if do && pt.Access != "write" {
		var writable []string
		for _, n := range prof.PointNames() {
			if prof.Points[n].Access == "write" {
				writable = append(writable, n)
			}
		}
		fix := "make the capability kind: read; profile " + name + " has no writable points"
		if len(writable) > 0 {
			fix = "make the capability kind: read, or use a point the profile marks writable: " + strings.Join(writable, ", ")
		}
		p.Add(fmt.Sprintf("profile %s point %s is read-only (%s)", name, pt.Name, pt.Description), fix, "point")
		ok = false
	}
	if !ok {
		return nil, false
	}
	k.Table, k.DataType = &pt.Table, &pt.DataType
	if pt.ByteOrder != "" {
		k.ByteOrder = &pt.ByteOrder
	}
	k.Bit, k.Scale, k.Offset = pt.Bit, pt.Scale, pt.Offset
	return pt, true
}
