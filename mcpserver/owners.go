package mcpserver

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/physd/physd/node"
)

// Who owns a routed tool. In a site mesh an owner is a gateway's device
// id, and the source argument names it. At the fleet endpoint (physd
// fleet, Options.Fleet) gateways of different sites may share a device
// id, so an owner is a site and a device: the tools take a site argument
// (required) and source (the device id in that site, needed only where a
// site has the tool on several gateways). Inside this package an owner is
// one string either way, OwnerKey's.

// OwnerKey names an owner: its device id in a site mesh, site/device at
// the fleet endpoint (a device id holds no '/').
func OwnerKey(site, device string) string {
	if site == "" {
		return device
	}
	return site + "/" + device
}

// SplitOwner is OwnerKey's inverse.
func SplitOwner(key string) (site, device string) {
	if i := strings.IndexByte(key, '/'); i >= 0 {
		return key[:i], key[i+1:]
	}
	return "", key
}

// key is the tool's owner.
func (t RemoteTool) key() string { return OwnerKey(t.Site, t.Owner) }

// ownerArgs are the arguments that pick an owner.
type ownerArgs struct {
	Site   string `json:"site"`
	Source string `json:"source"`
}

// ownerArgsOf reads site and source from a call's arguments (absent ones
// are empty; their types are checked by the tool's own decoding).
func ownerArgsOf(raw json.RawMessage) ownerArgs {
	var a struct {
		Site   any `json:"site"`
		Source any `json:"source"`
	}
	_ = json.Unmarshal(raw, &a)
	s, _ := a.Site.(string)
	d, _ := a.Source.(string)
	return ownerArgs{Site: s, Source: d}
}

// pick resolves the arguments to one of owners: the fleet's site and
// source (source may be left out where the site has one owner), or the
// mesh's source. An error is the caller's to fix, named by its field.
func (a ownerArgs) pick(owners []string, fleet bool, tool string) (string, error) {
	if !fleet {
		if slices.Contains(owners, a.Source) {
			return a.Source, nil
		}
		return "", nil // the mesh's own messages (route) say why
	}
	if a.Site == "" {
		return "", &node.InputError{Field: "site", Msg: fmt.Sprintf("required: the site whose %s to use, one of %s", tool, strings.Join(sitesOf(owners), ", "))}
	}
	var in []string
	for _, o := range owners {
		site, device := SplitOwner(o)
		if site == a.Site && (a.Source == "" || device == a.Source) {
			in = append(in, o)
		}
	}
	switch {
	case len(in) == 1:
		return in[0], nil
	case len(in) > 1:
		return "", &node.InputError{Field: "source", Msg: fmt.Sprintf("site %q has %s on %s: name one as source", a.Site, tool, strings.Join(devicesOf(in), ", "))}
	case a.Source != "" && slices.Contains(sitesOf(owners), a.Site):
		return "", &node.InputError{Field: "source", Msg: fmt.Sprintf("%q is not a gateway of site %q with %s; one of %s", truncateArg(a.Source), a.Site, tool, strings.Join(devicesOf(inSite(owners, a.Site)), ", "))}
	}
	return "", &node.InputError{Field: "site", Msg: fmt.Sprintf("%q has no %s here; one of %s", truncateArg(a.Site), tool, strings.Join(sitesOf(owners), ", "))}
}

func sitesOf(owners []string) []string {
	return partOf(owners, func(o string) string { s, _ := SplitOwner(o); return s })
}

func devicesOf(owners []string) []string {
	return partOf(owners, func(o string) string { _, d := SplitOwner(o); return d })
}

// partOf lists part(owner) of each owner once, sorted.
func partOf(owners []string, part func(string) string) []string {
	var out []string
	for _, o := range owners {
		if p := part(o); !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

func inSite(owners []string, site string) []string {
	return slices.DeleteFunc(slices.Clone(owners), func(o string) bool { s, _ := SplitOwner(o); return s != site })
}

// withSite adds the fleet's owner arguments to a tool's input schema:
// site (required, one of the owners' sites) and source (one of their
// device ids; required only where a site has the tool on several
// gateways).
func withSite(schema json.RawMessage, owners []string) json.RawMessage {
	var s map[string]any
	_ = json.Unmarshal(schema, &s)
	props, _ := s["properties"].(map[string]any)
	if props == nil {
		props = map[string]any{}
		s["properties"] = props
	}
	setOwnerEnums(props, owners)
	req, _ := s["required"].([]any)
	s["required"] = append(req, "site")
	b, _ := json.Marshal(s)
	return b
}

// setOwnerEnums (re)writes the site and source properties for owners.
func setOwnerEnums(props map[string]any, owners []string) {
	props["site"] = map[string]any{"type": "string", "enum": anys(sitesOf(owners)),
		"description": "The fleet site (network.fleet.site) whose gateway owns the capability."}
	desc := "Device id of the gateway in that site; needed only where the site has this capability on several gateways."
	props["source"] = map[string]any{"type": "string", "enum": anys(devicesOf(owners)), "description": desc}
}

// narrowSites returns a fleet tool with its site and source enums limited
// to owners.
func narrowSites(raw json.RawMessage, owners []string) json.RawMessage {
	var schema map[string]any
	if json.Unmarshal(raw, &schema) != nil {
		return raw
	}
	props, _ := schema["properties"].(map[string]any)
	if props = maps.Clone(props); props == nil {
		return raw
	}
	setOwnerEnums(props, owners)
	schema["properties"] = props
	b, _ := json.Marshal(schema)
	return b
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
