package modbus

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/physd/physd/drivers"
)

// BenchmarkPoll20 polls 20 capabilities of one Modbus TCP unit (the
// in-process simonvetter server): each op reads all 20 concurrently, as
// an agent reading a device's state does. Compare the two sub-benchmarks:
//
//	go test -run '^$' -bench 'Poll20|Do' -benchtime 2s ./drivers/modbus/
func BenchmarkPoll20(b *testing.B) {
	for _, mode := range []struct {
		name  string
		extra string
	}{{"coalesced", ""}, {"one_request_each", "coalesce: false"}} {
		b.Run(mode.name, func(b *testing.B) {
			srv, bank := peer(b)
			bus := openTCP(b, srv.Addr, mode.extra)
			var points []drivers.Point
			for i := range 10 { // 10 int16 setpoints at 0..9, 10 float32 temperatures at 10..29
				bank.SetHolding(1, uint16(i), uint16(200+i))
				points = append(points, pointOn(b, bus, fmt.Sprintf(`{name: s, data_type: float, binding: {type: modbus, table: holding, address: %d, data_type: int16, scale: 0.1}}`, i)))
				bank.SetHolding(1, uint16(10+2*i), 0x41AC, 0)
				points = append(points, pointOn(b, bus, fmt.Sprintf(`{name: t, data_type: float, binding: {type: modbus, table: holding, address: %d, data_type: float32}}`, 10+2*i)))
			}
			poll := func() {
				var wg sync.WaitGroup
				for _, p := range points {
					wg.Go(func() {
						ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
						defer cancel()
						if _, err := p.Read(ctx); err != nil {
							b.Error(err)
						}
					})
				}
				wg.Wait()
			}
			poll() // connect
			bank.ResetCount()
			b.ResetTimer()
			for b.Loop() {
				poll()
			}
			b.ReportMetric(float64(bank.Count())/float64(b.N), "requests/poll")
		})
	}
}

// BenchmarkDo compares a plain read with the node's do_ sequence on the
// same device: read the previous value, write, read back (settle_ms 0).
func BenchmarkDo(b *testing.B) {
	srv, _ := peer(b)
	bus := openTCP(b, srv.Addr, "")
	p := pointOn(b, bus, `{name: sp, kind: do, data_type: float, binding: {type: modbus, table: holding, address: 0, data_type: int16, scale: 0.1}}`)
	ctx := context.Background()
	b.Run("read", func(b *testing.B) {
		for b.Loop() {
			if _, err := p.Read(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("do_write_readback", func(b *testing.B) {
		v := 20.0
		for b.Loop() {
			if _, err := p.Read(ctx); err != nil {
				b.Fatal(err)
			}
			v = 40 - v
			if err := p.Write(ctx, v); err != nil {
				b.Fatal(err)
			}
			r, err := p.Read(ctx)
			if err != nil || r.Value != v {
				b.Fatalf("read-back %v, %v", r.Value, err)
			}
		}
	})
}
