package modbus

import "sort"

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
	type key struct {
		unit  byte
		table table
	}
	type member struct {
		r   *request
		idx int
	}
	groups := map[key][]member{}
	var order []key
	for i, r := range reads {
		k := key{r.unit, r.table}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], member{r, i})
	}
	var out []*span
	for _, k := range order {
		ms := groups[k]
		if !coalesce {
			for _, m := range ms {
				out = append(out, &span{unit: k.unit, table: k.table, addr: m.r.addr, qty: m.r.qty, reqs: []*request{m.r}, first: m.idx})
			}
			continue
		}
		sort.SliceStable(ms, func(i, j int) bool { return ms[i].r.addr < ms[j].r.addr })
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
	sort.SliceStable(out, func(i, j int) bool { return out[i].first < out[j].first })
	return out
}
