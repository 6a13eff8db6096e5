package web

import (
	"fmt"
	"html/template"
	"math"
	"strings"
	"time"

	"github.com/physd/physd/history"
	"github.com/physd/physd/promcp"
)

// Chart geometry of the console's trend cards (SVG user units, drawn at
// CSS pixels and scaled down on narrow screens): a plot area with the
// value axis on the left and the time axis below.
const (
	chartW, chartH = 320, 116
	plotL, plotT   = 46, 10  // the plot area's left and top edge
	plotW, plotH   = 266, 80 // its size; the time labels sit below it
)

// charts renders each numeric capability's last hour from the history as
// an inline SVG (no script, no external asset), by tool: the min–max band
// of each minute, a step line at each minute's mean, the value axis with
// the unit, the time axis, and the hour's min and max. Capabilities
// without history get none.
func (s *Server) charts(now time.Time) map[string]template.HTML {
	h := s.opts.History
	if h == nil {
		return nil
	}
	out := map[string]template.HTML{}
	since := now.Add(-time.Hour)
	for _, c := range s.n.Manifest().Capabilities {
		series, err := h.Query(c.Name, since, now, h.Config().Resolution)
		if err != nil || len(series.Buckets) == 0 {
			continue
		}
		lo, hi := 0.0, 0.0
		if c.Range != nil {
			lo, hi = c.Range.Min, c.Range.Max
		}
		out[c.ToolName()] = chart(series, since, now, lo, hi, c.Unit, c.ToolName())
	}
	return out
}

// extent is the lowest and highest value the series shows (ok false: none).
func extent(series *history.Series) (lo, hi float64, ok bool) {
	for _, b := range series.Buckets {
		if b.Min == nil {
			continue
		}
		if !ok {
			lo, hi, ok = *b.Min, *b.Max, true
		}
		lo, hi = min(lo, *b.Min), max(hi, *b.Max)
	}
	return lo, hi, ok
}

// chart draws series between since and now; the value axis spans [lo, hi]
// (the capability's range) widened to the values it shows.
func chart(series *history.Series, since, now time.Time, lo, hi float64, unit, tool string) template.HTML {
	vmin, vmax, any := extent(series)
	if any && lo == hi {
		lo, hi = vmin, vmax
	}
	if any {
		lo, hi = min(lo, vmin), max(hi, vmax)
	}
	if hi == lo {
		hi, lo = hi+1, lo-1
	}
	span := now.Sub(since).Seconds()
	x := func(t time.Time) float64 { return plotL + plotW*t.Sub(since).Seconds()/span }
	y := func(v float64) float64 { return plotT + plotH - plotH*(v-lo)/(hi-lo) }
	step := float64(series.StepS)
	var band, line strings.Builder
	for _, b := range series.Buckets {
		if b.Min == nil {
			continue
		}
		x0 := x(b.Start)
		w := max(min(plotW*step/span, plotL+plotW-x0), 1) // the minute under way ends at now
		x0 = min(x0, plotL+plotW-w)
		fmt.Fprintf(&band, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f"/>`, x0, y(*b.Max), w, max(y(*b.Min)-y(*b.Max), 1))
		fmt.Fprintf(&line, "%.1f,%.1f %.1f,%.1f ", x0, y(*b.Mean), x0+w, y(*b.Mean)) // a step per minute: one minute shows too
	}
	label := tool + ", last hour"
	stats := "no readings in the last hour"
	if any {
		stats = "min " + promcp.FormatValue(round3(vmin)) + " · max " + promcp.FormatValue(round3(vmax)) + " " + unit
		label += ": " + stats
	}
	// Every value is a number formatted here or escaped with
	// template.HTMLEscapeString: nothing reaches the markup unescaped.
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s">`,
		chartW, chartH, chartW, chartH, template.HTMLEscapeString(label))
	axes(&b, lo, hi, unit, since, now)
	// The mean line is 2 units wide: at any height it covers at least one
	// pixel row fully, so it reads as one solid line.
	fmt.Fprintf(&b, `<g fill="#cfe3f7">%s</g><polyline fill="none" stroke="#1f5fa8" stroke-width="2" points="%s"/></svg>`,
		band.String(), strings.TrimSpace(line.String()))
	fmt.Fprintf(&b, `<p class="stats">%s</p>`, template.HTMLEscapeString(stats))
	return template.HTML(b.String())
}

// axes draws the grid, the value labels (with the unit) and the time
// labels of a chart.
func axes(b *strings.Builder, lo, hi float64, unit string, since, now time.Time) {
	b.WriteString(`<g stroke="#e3e3e3" stroke-width="1">`)
	for i := 0; i <= 4; i++ {
		yy := plotT + plotH*float64(i)/4
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>`, plotL, yy, plotL+plotW, yy)
	}
	for i := 0; i <= 4; i++ {
		xx := plotL + plotW*float64(i)/4
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d"/>`, xx, plotT, xx, plotT+plotH)
	}
	b.WriteString(`</g><g fill="#555" font-size="10" font-family="system-ui,sans-serif">`)
	for i, v := range []float64{hi, (lo + hi) / 2, lo} {
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`, plotL-4, plotT+plotH*float64(i)/2+3.5, template.HTMLEscapeString(promcp.FormatValue(round3(v))))
	}
	fmt.Fprintf(b, `<text x="2" y="%d">%s</text>`, plotT+plotH+24, template.HTMLEscapeString(unitAbbrev(unit)))
	for i, t := range []time.Time{since, since.Add(30 * time.Minute), now} {
		anchor := [...]string{"start", "middle", "end"}[i]
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="%s">%s</text>`, plotL+plotW*float64(i)/2, plotT+plotH+13, anchor, t.UTC().Format("15:04"))
	}
	b.WriteString(`</g>`)
}

// round3 keeps three decimals: an axis label of 33.333333 helps nobody.
func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

// unitAbbrev is the short form of a manifest unit for an axis.
func unitAbbrev(u string) string {
	switch u {
	case "celsius":
		return "°C"
	case "percent":
		return "%"
	case "litre":
		return "L"
	}
	return u
}
