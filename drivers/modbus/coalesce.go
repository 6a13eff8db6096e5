package modbus

import "slices"

// span is one Modbus read on the wire, serving one or more queued reads.
type span struct {
	unit  byte
	table table
	addr  uint16
	qty   uint16
	reqs  []*request
	first int // arrival index of its earliest request
}

// plan merges reads that are queued together: reads of the same unit and
// table whose ranges overlap or lie within gap registers (or bits) of each
// other become one request, up to the protocol limits (125 registers, 2000
// bits). The gap bytes are read and discarded; a gap over a hole the
// device does not implement draws an exception, and the worker then retries
// the members one by one (worker.readSpan).
//
// Spans come out in the order of their earliest request, so merging never
// lets a later read overtake an earlier one by more than the batch. reads
// must not contain writes: the worker cuts batches at every write, which
// is what keeps a read queued after a write from being served before it.
func plan(reads []*request, coalesce bool, gap int) []*span {
	type member struct {
		r   *request
		idx int
	}
	type group struct {
		unit  byte
		table table
		ms    []member
	}
	// A batch is mostly one unit's one table (a poll of a device): a few
	// groups, found by a scan rather than a map.
	var groups []*group
	for i, r := range reads {
		var g *group
		for _, x := range groups {
			if x.unit == r.unit && x.table == r.table {
				g = x
				break
			}
		}
		if g == nil {
			g = &group{unit: r.unit, table: r.table, ms: make([]member, 0, min(len(reads)-i, 512))}
			groups = append(groups, g)
		}
		g.ms = append(g.ms, member{r, i})
	}
	var out []*span
	for _, g := range groups {
		k, ms := g, g.ms
		if !coalesce {
			for _, m := range ms {
				out = append(out, &span{unit: k.unit, table: k.table, addr: m.r.addr, qty: m.r.qty, reqs: []*request{m.r}, first: m.idx})
			}
			continue
		}
		slices.SortStableFunc(ms, func(a, b member) int { return int(a.r.addr) - int(b.r.addr) })
		limit := k.table.maxRead()
		var cur *span
		var end int // exclusive end of cur
		for _, m := range ms {
			start, stop := int(m.r.addr), int(m.r.addr)+int(m.r.qty)
			if cur != nil && start <= end+gap && max(end, stop)-int(cur.addr) <= limit {
				end = max(end, stop)
				cur.qty = uint16(end - int(cur.addr))
				cur.reqs = append(cur.reqs, m.r)
				cur.first = min(cur.first, m.idx)
				continue
			}
			cur = &span{unit: k.unit, table: k.table, addr: m.r.addr, qty: m.r.qty, reqs: []*request{m.r}, first: m.idx}
			end = stop
			out = append(out, cur)
		}
	}
	slices.SortStableFunc(out, func(a, b *span) int { return a.first - b.first })
	return out
}
