package modbus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/drivers/modbus/modbustest"
	"github.com/physd/physd/manifest"
	"gopkg.in/yaml.v3"
)

const testFile = "m.yml"

// mapping parses a YAML snippet into its top mapping node.
func mapping(t testing.TB, src string) *yaml.Node {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatalf("bad test YAML: %v\n%s", err, src)
	}
	if len(doc.Content) == 0 {
		return nil
	}
	return doc.Content[0]
}

// busFrom builds a *manifest.Bus the way the parser hands it over: type
// taken out, the other keys in Config.
func busFrom(t testing.TB, kind, src string) *manifest.Bus {
	t.Helper()
	return &manifest.Bus{Name: "plc", Type: kind, Config: mapping(t, src), Pos: manifest.Pos{File: testFile, Line: 1, Col: 1}, Field: "buses.plc"}
}

// capFrom builds a capability from YAML with name, kind, data_type,
// enum_values and binding; the binding's keys other than type, address and
// bus become Params, as the parser does.
func capFrom(t testing.TB, src string) *manifest.Capability {
	t.Helper()
	n := mapping(t, src)
	c := &manifest.Capability{Pos: manifest.Pos{File: testFile, Line: n.Line, Col: n.Column}, Kind: manifest.KindRead, TimeoutMS: 1000}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i].Value, n.Content[i+1]
		switch k {
		case "name":
			c.Name = v.Value
		case "kind":
			c.Kind = v.Value
		case "data_type":
			c.DataType = v.Value
		case "enum_values":
			for _, e := range v.Content {
				c.EnumValues = append(c.EnumValues, e.Value)
			}
		case "binding":
			c.Binding = manifest.Binding{Pos: manifest.Pos{File: testFile, Line: v.Line, Col: v.Column}, Field: "capabilities[0].binding"}
			params := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: v.Line, Column: v.Column}
			for j := 0; j+1 < len(v.Content); j += 2 {
				bk, bv := v.Content[j], v.Content[j+1]
				switch bk.Value {
				case "type":
					c.Binding.Type = bv.Value
				case "address":
					c.Binding.Address = bv.Value
				case "bus":
					c.Binding.Bus = bv.Value
				default:
					params.Content = append(params.Content, bk, bv)
				}
			}
			c.Binding.Params = params
		default:
			t.Fatalf("capFrom: unexpected key %q", k)
		}
	}
	if c.Name == "" {
		c.Name = "p"
	}
	return c
}

// peer is an in-process simonvetter Modbus TCP server over a Bank.
func peer(t testing.TB) (*modbustest.Server, *modbustest.Bank) {
	t.Helper()
	bank := modbustest.NewBank(1000)
	srv, err := modbustest.StartTCP("127.0.0.1:0", bank)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	return srv, bank
}

// openTCP opens a modbus_tcp bus to addr with extra config keys (YAML
// flow-mapping entries, e.g. "timeout_ms: 100").
func openTCP(t testing.TB, addr, extra string) *Bus {
	t.Helper()
	src := fmt.Sprintf("{address: %q", addr)
	if extra != "" {
		src += ", " + extra
	}
	src += "}"
	b, err := Open(context.Background(), busFrom(t, TypeTCP, src))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// pointOn opens a point for a capability written in YAML.
func pointOn(t testing.TB, b *Bus, src string) drivers.Point {
	t.Helper()
	p, err := b.Point(capFrom(t, src))
	if err != nil {
		t.Fatalf("Point(%s): %v", src, err)
	}
	return p
}

// readOK reads with a deadline and fails the test on error.
// readOK reads p until it answers (at most 5 attempts within 2 s): the
// tests run with timeouts of tens of milliseconds, which a loaded machine
// (CI running every package at once) can miss. A timeout is never a wrong
// value; the value returned is what the tests judge.
func readOK(t testing.TB, p drivers.Point) any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var err error
	for range 5 {
		var r drivers.Reading
		if r, err = p.Read(ctx); err == nil {
			return r.Value
		}
		if !errors.Is(err, drivers.ErrTimeout) || ctx.Err() != nil {
			break
		}
	}
	t.Fatalf("Read: %v", err)
	return nil
}

func readErr(t testing.TB, p drivers.Point, timeout time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	r, err := p.Read(ctx)
	if err == nil {
		t.Fatalf("Read = %v, want an error", r.Value)
	}
	return err
}

func writeCtx(p drivers.Point, v any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return p.Write(ctx, v)
}

func mustContain(t testing.TB, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("err = nil, want one containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("err = %v\nwant it to contain %q", err, p)
		}
	}
}

// waitFor polls cond (a condition, not a timer: it returns as soon as cond
// holds) and fails after d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
