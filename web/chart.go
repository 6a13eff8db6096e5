package web

import (
	"fmt"
	"html/template"
	"strings"
	"time"

	"github.com/physd/physd/history"
)

// Chart geometry of the status page's sparklines (CSS pixels).
const (
	chartW, chartH = 240, 36
)

// charts renders each numeric capability's last hour from the history as
// an inline SVG (no script, no external asset): the min–max band of each
// minute and a step line at each minute's mean. Capabilities without history get
// none.
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
		out[c.ToolName()] = sparkline(series, since, now, lo, hi)
	}
	return out
}

// sparkline draws series between since and now; the y axis spans [lo, hi]
// (the capability's range) widened to the values it shows.
func sparkline(series *history.Series, since, now time.Time, lo, hi float64) template.HTML {
	first := true
	for _, b := range series.Buckets {
		if b.Min == nil {
			continue
		}
		if first && lo == hi {
			lo, hi = *b.Min, *b.Max
		}
		first = false
		lo, hi = min(lo, *b.Min), max(hi, *b.Max)
	}
	if hi == lo {
		hi, lo = hi+1, lo-1
	}
	span := now.Sub(since).Seconds()
	x := func(t time.Time) float64 { return float64(chartW) * t.Sub(since).Seconds() / span }
	y := func(v float64) float64 { return float64(chartH) - float64(chartH)*(v-lo)/(hi-lo) }
	step := float64(series.StepS)
	var band, line strings.Builder
	for _, b := range series.Buckets {
		if b.Min == nil {
			continue
		}
		x0 := x(b.Start)
		w := max(min(float64(chartW)*step/span, float64(chartW)-x0), 1) // the minute under way ends at now
		x0 = min(x0, float64(chartW)-w)
		fmt.Fprintf(&band, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f"/>`, x0, y(*b.Max), w, max(y(*b.Min)-y(*b.Max), 1))
		fmt.Fprintf(&line, "%.1f,%.1f %.1f,%.1f ", x0, y(*b.Mean), x0+w, y(*b.Mean)) // a step per minute: one minute shows too
	}
	// Values are numbers formatted here: nothing from the caller reaches
	// the markup unescaped.
	return template.HTML(fmt.Sprintf(`<svg class="chart" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="last hour, %s to %s">`+
		`<g fill="#cfe3f7">%s</g><polyline fill="none" stroke="#1f5fa8" stroke-width="1.5" points="%s"/></svg>`,
		chartW, chartH, chartW, chartH, trimNum(lo), trimNum(hi), band.String(), strings.TrimSpace(line.String())))
}

func trimNum(v float64) string { return fmt.Sprintf("%g", v) }
