package mesh

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
)

// Catalog is what a node offers the mesh: one entry per tool. The owner is
// the authority for its catalog; others hold the latest copy whose hash
// matches the owner's gossiped metadata.
type Catalog struct {
	DeviceID     string         `json:"device_id"`
	Zone         string         `json:"zone,omitempty"`
	Area         string         `json:"area,omitempty"` // device.location.area (views select on it)
	Capabilities []CatalogEntry `json:"capabilities"`
	// Hash is set by the mesh: the hex sha256 of the canonical catalog
	// (see Canonical). Any value given is replaced.
	Hash string `json:"hash"`
}

// CatalogEntry describes one tool (read_x or do_x).
type CatalogEntry struct {
	Tool string   `json:"tool"`
	Kind string   `json:"kind"` // read | do
	Zone string   `json:"zone,omitempty"`
	Unit string   `json:"unit,omitempty"`
	Tags []string `json:"tags,omitempty"`
	Min  *float64 `json:"min,omitempty"`
	Max  *float64 `json:"max,omitempty"`
	// What another node needs to list the tool for routing.
	DataType    string   `json:"data_type,omitempty"`
	Description string   `json:"description,omitempty"`
	EnumValues  []string `json:"enum_values,omitempty"`
	SideEffects []string `json:"side_effects,omitempty"`
	Family      string   `json:"family,omitempty"` // served as one tool per family where families are on
	// Lease is the do_ tool's lease terms (manifest lease:, with safe:), so
	// a gateway that routes the tool offers hold_s within them.
	Lease *CatalogLease `json:"lease,omitempty"`
}

// CatalogLease is a leased output's terms: the hold without hold_s, the
// longest a do_ may ask for, and the safe value it goes to after.
type CatalogLease struct {
	DefaultS  int    `json:"default_s"`
	MaxS      int    `json:"max_s"`
	SafeValue string `json:"safe_value"`
}

// Canonical returns a deep copy with entries sorted by tool, kind and zone,
// each entry's tags sorted and de-duplicated, and Hash computed over the
// JSON of that canonical form without the hash.
func (c Catalog) Canonical() Catalog {
	out := Catalog{DeviceID: c.DeviceID, Zone: c.Zone, Area: c.Area, Capabilities: make([]CatalogEntry, len(c.Capabilities))}
	for i, e := range c.Capabilities {
		e.Tags = slices.Compact(slices.Sorted(slices.Values(e.Tags)))
		if len(e.Tags) == 0 {
			e.Tags = nil
		}
		if e.Min != nil {
			v := *e.Min
			e.Min = &v
		}
		if e.Max != nil {
			v := *e.Max
			e.Max = &v
		}
		out.Capabilities[i] = e
	}
	slices.SortStableFunc(out.Capabilities, func(a, b CatalogEntry) int {
		return cmp.Or(cmp.Compare(a.Tool, b.Tool), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Zone, b.Zone))
	})
	b, _ := json.Marshal(out) // Hash is "" here; cannot fail (no NaN: see validate)
	sum := sha256.Sum256(b)
	out.Hash = hex.EncodeToString(sum[:])
	return out
}

// clone is a deep copy.
func (c Catalog) clone() Catalog {
	out := c
	out.Capabilities = make([]CatalogEntry, len(c.Capabilities))
	for i, e := range c.Capabilities {
		e.Tags = append([]string(nil), e.Tags...)
		e.EnumValues = append([]string(nil), e.EnumValues...)
		e.SideEffects = append([]string(nil), e.SideEffects...)
		if e.Min != nil {
			v := *e.Min
			e.Min = &v
		}
		if e.Max != nil {
			v := *e.Max
			e.Max = &v
		}
		out.Capabilities[i] = e
	}
	return out
}

// Find returns the entry for tool, or false.
func (c Catalog) Find(tool string) (CatalogEntry, bool) {
	for _, e := range c.Capabilities {
		if e.Tool == tool {
			return e, true
		}
	}
	return CatalogEntry{}, false
}

func (c Catalog) validate() error {
	seen := map[string]bool{}
	for _, e := range c.Capabilities {
		if e.Tool == "" {
			return fmt.Errorf("catalog of %s: an entry has no tool name", c.DeviceID)
		}
		if seen[e.Tool] {
			return fmt.Errorf("catalog of %s: tool %q listed twice", c.DeviceID, e.Tool)
		}
		seen[e.Tool] = true
		for _, p := range []*float64{e.Min, e.Max} {
			if p != nil && (*p != *p || *p > 1e308 || *p < -1e308) {
				return fmt.Errorf("catalog of %s: tool %q has a non-finite range", c.DeviceID, e.Tool)
			}
		}
	}
	return nil
}

// encodeCatalog canonicalises and encodes c.
func encodeCatalog(c Catalog) (Catalog, []byte, error) {
	if err := c.validate(); err != nil {
		return Catalog{}, nil, err
	}
	c = c.Canonical()
	b, err := json.Marshal(c)
	if err != nil {
		return Catalog{}, nil, err
	}
	if len(b) > MaxPayload {
		return Catalog{}, nil, fmt.Errorf("catalog of %s is %d bytes encoded, over the %d-byte limit", c.DeviceID, len(b), MaxPayload)
	}
	return c, b, nil
}

// decodeCatalog decodes a catalog and checks that its hash is the hash of
// its content.
func decodeCatalog(b []byte) (Catalog, error) {
	var c Catalog
	if err := json.Unmarshal(b, &c); err != nil {
		return Catalog{}, fmt.Errorf("decode catalog: %w", err)
	}
	if err := c.validate(); err != nil {
		return Catalog{}, err
	}
	want := c.Hash
	c = c.Canonical()
	if c.Hash != want {
		return Catalog{}, fmt.Errorf("catalog of %s: hash %.12s does not match its content (%.12s)", c.DeviceID, want, c.Hash)
	}
	return c, nil
}

// meta is the memberlist node metadata (≤ 512 bytes): only the catalog
// hash travels in gossip; the catalog itself on push/pull or by request.
type meta struct {
	V int    `json:"v"`
	H string `json:"h"`
}

const metaVersion = 1

func encodeMeta(hash string) []byte {
	b, _ := json.Marshal(meta{V: metaVersion, H: hash})
	return b
}

func decodeMeta(b []byte) (hash string, ok bool) {
	var md meta
	if len(b) == 0 || json.Unmarshal(b, &md) != nil || md.V != metaVersion {
		return "", false
	}
	return md.H, true
}
