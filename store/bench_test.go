package store

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkFullLedger fills a ledger with 100 000 keys of realistic do_
// answers (a day at 1.2 actuations a second), reopens it as a restarted
// daemon would, and looks keys up. It reports what a full ledger costs:
// bytes a key on disk (records and index, bbolt headers included), the
// file, the Go heap in use after the reopen, and the process's file-backed
// resident pages (bbolt's mmap: page cache the kernel reclaims under
// pressure, not heap).
//
//	go test ./store -run '^$' -bench FullLedger -benchtime 20000x
func BenchmarkFullLedger(b *testing.B) {
	const keys = 100_000
	dir := b.TempDir()
	s, err := Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	s.db.NoSync = true // filling is not what is measured
	now := time.Now()
	for i := range keys {
		key := fmt.Sprintf("%08x-0d4e-4f61-9a55-%012x", i*2654435761, i)
		at := now.Add(-time.Duration(keys-i) * 800 * time.Millisecond)
		e := LedgerEntry{Key: key, Tool: "do_heater_zone_a", ArgsHash: fmt.Sprintf("%064x", i*7919), Created: at,
			Response: answerFor(key, at, i)}
		if _, err := s.Begin(e, nil); err != nil {
			b.Fatal(err)
		}
		s.CompleteDeferred(e)
	}
	s.db.NoSync = false
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	s, err = Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	st := s.LedgerStats()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		key := fmt.Sprintf("%08x-0d4e-4f61-9a55-%012x", (i%keys)*2654435761, i%keys)
		if e, err := s.Lookup(key); err != nil || e == nil || e.State != StateDone {
			b.Fatal(key, e, err)
		}
	}
	b.StopTimer()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(st.Bytes)/float64(st.Keys), "bytes/key")
	b.ReportMetric(float64(st.FileBytes)/(1<<20), "file-MiB")
	b.ReportMetric(float64(int64(after.HeapInuse)-int64(before.HeapInuse))/(1<<20), "heap-MiB-added")
	b.ReportMetric(float64(rssFile())/(1<<20), "rss-file-MiB")
}

// answerFor is a do_ answer as physd writes it (policy and gate notes
// included).
func answerFor(key string, at time.Time, i int) []byte {
	return []byte(`{"status":"success","idempotency_key":"` + key + `","compensable":true,"compensation_hint":"do_heater_zone_a value=` +
		strconv.Itoa(i%80) + `","timestamp":"` + at.UTC().Format(time.RFC3339Nano) + `","applied_value":` + strconv.Itoa((i+7)%80) +
		`,"previous_value":` + strconv.Itoa(i%80) + `,"side_effects":["zone_a_temperature_change","energy_consumption"],"capability":"do_heater_zone_a","source":"gw_greenhouse_001","requested_value":` +
		strconv.Itoa((i+7)%80) + `,"verified":true,"permission":"allowed","policy":{"configured":true,"decision":"allowed"},` +
		`"gate":{"decision":"allow","layer":"L0","reason":"L0 allow rule heaters_bounded","engine":"guard:physd-0.2.0","fingerprint":"sha256:` +
		fmt.Sprintf("%064x", i*104729) + `"},"audit":{"seq":` + strconv.Itoa(i+1) + `}}`)
}

// rssFile is this process's file-backed resident memory (RssFile in
// /proc/self/status), 0 where it is not available.
func rssFile() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "RssFile:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}
