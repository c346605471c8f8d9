package ops

import (
	"fmt"
	"math"
	"strings"

	"github.com/outboxkit/orders/internal/outbox/admin"
)

// The charts are inline SVG computed here: geometry in Go, markup in the
// template, colours in the stylesheet. No script, no library.

// chart is one SVG chart, laid out.
type chart struct {
	ID            string
	Width, Height float64
	// The plot area.
	Left, Top, Right, Bottom float64
	Title, Desc              string
	YTicks                   []tick
	XTicks                   []tick
	Bars                     []bar
	// Line and Area are SVG path data, for line charts.
	Line, Area string
	// Hits are invisible full-height columns carrying each minute's
	// tooltip (an SVG <title>: no script needed).
	Hits      []hit
	Empty     bool
	EmptyText string
}

type hit struct {
	X, W  float64
	Label string
}

type tick struct {
	Pos   float64
	Label string
}

// bar is one minute's stacked bar: segments bottom up.
type bar struct {
	X, W     float64
	Segments []segment
}

type segment struct {
	Y, H  float64
	Class string
}

const (
	chartWidth   = 1120
	marginLeft   = 44
	marginRight  = 10
	marginTop    = 10
	marginBottom = 26
)

func frame(id string, height float64) chart {
	return chart{ID: id, Width: chartWidth, Height: height, Left: marginLeft, Top: marginTop,
		Right: chartWidth - marginRight, Bottom: height - marginBottom}
}

// niceCeil rounds v up to 1, 2, 2.5, 4, 5 or 10 times a power of ten, at
// least 4 (so four gridlines have whole labels).
func niceCeil(v float64) float64 {
	if v <= 4 {
		return 4
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 4, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func (c *chart) yAxis(maxV float64) func(float64) float64 {
	top := niceCeil(maxV)
	scale := func(v float64) float64 { return c.Bottom - v/top*(c.Bottom-c.Top) }
	for i := 0; i <= 4; i++ {
		v := top * float64(i) / 4
		c.YTicks = append(c.YTicks, tick{Pos: scale(v), Label: compact(v)})
	}
	return scale
}

// xAxis labels every 15 minutes (UTC) and the current minute.
func (c *chart) xAxis(minutes []admin.MinuteActivity) (slot float64) {
	slot = (c.Right - c.Left) / float64(len(minutes))
	for i, m := range minutes {
		if m.Minute.UTC().Minute()%15 == 0 && i < len(minutes)-3 {
			c.XTicks = append(c.XTicks, tick{Pos: c.Left + slot*(float64(i)+0.5), Label: m.Minute.UTC().Format("15:04")})
		}
	}
	if n := len(minutes); n > 0 {
		c.XTicks = append(c.XTicks, tick{Pos: c.Left + slot*(float64(n)-0.5), Label: "now"})
	}
	return slot
}

func compact(v float64) string {
	switch {
	case v >= 1e6:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e6), ".0") + "M"
	case v >= 1e4:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e3), ".0") + "k"
	}
	return strings.TrimSuffix(fmt.Sprintf("%.1f", v), ".0")
}

func span(minutes []admin.MinuteActivity) string {
	if len(minutes) == 0 {
		return ""
	}
	return fmt.Sprintf("from %s to %s UTC", minutes[0].Minute.UTC().Format("15:04"),
		minutes[len(minutes)-1].Minute.UTC().Format("15:04"))
}

// deliveriesChart stacks each minute's attempts: delivered, retried, failed.
func deliveriesChart(minutes []admin.MinuteActivity) chart {
	c := frame("deliveries", 230)
	var peak, delivered, retried, failed int64
	for _, m := range minutes {
		peak = max(peak, m.Delivered+m.Retried+m.Failed)
		delivered += m.Delivered
		retried += m.Retried
		failed += m.Failed
	}
	y := c.yAxis(float64(peak))
	slot := c.xAxis(minutes)
	w := max(slot*0.72, 1)
	for i, m := range minutes {
		x := c.Left + slot*float64(i) + (slot-w)/2
		b := bar{X: x, W: w}
		c.Hits = append(c.Hits, hit{X: c.Left + slot*float64(i), W: slot, Label: fmt.Sprintf("%s UTC: %d delivered, %d retried, %d failed",
			m.Minute.UTC().Format("15:04"), m.Delivered, m.Retried, m.Failed)})
		base := int64(0)
		for _, s := range []struct {
			n     int64
			class string
		}{{m.Delivered, "delivered"}, {m.Retried, "retried"}, {m.Failed, "failed"}} {
			if s.n == 0 {
				continue
			}
			top, bottom := y(float64(base+s.n)), y(float64(base))
			b.Segments = append(b.Segments, segment{Y: top, H: max(bottom-top, 0.5), Class: s.class})
			base += s.n
		}
		c.Bars = append(c.Bars, b)
	}
	c.Empty, c.EmptyText = peak == 0, "No delivery attempts in the last hour"
	c.Title = "Delivery attempts per minute, last hour"
	c.Desc = fmt.Sprintf("Stacked bars, one per minute %s: %d delivered, %d retried, %d failed in all; at most %d in one minute.",
		span(minutes), delivered, retried, failed, peak)
	return c
}

// backlogChart draws pending + claimed messages at the end of each minute.
func backlogChart(minutes []admin.MinuteActivity) chart {
	c := frame("backlog", 140)
	var peak int64
	for _, m := range minutes {
		peak = max(peak, m.Backlog)
	}
	y := c.yAxis(float64(peak))
	slot := c.xAxis(minutes)
	var line strings.Builder
	for i, m := range minutes {
		x, yy := c.Left+slot*(float64(i)+0.5), y(float64(m.Backlog))
		if i == 0 {
			fmt.Fprintf(&line, "M%.1f %.1f", x, yy)
		} else {
			fmt.Fprintf(&line, " L%.1f %.1f", x, yy)
		}
		c.Hits = append(c.Hits, hit{X: c.Left + slot*float64(i), W: slot,
			Label: fmt.Sprintf("%s UTC: %d waiting", m.Minute.UTC().Format("15:04"), m.Backlog)})
	}
	c.Line = line.String()
	if n := len(minutes); n > 0 {
		c.Area = fmt.Sprintf("%s L%.1f %.1f L%.1f %.1f Z", c.Line, c.Left+slot*(float64(n)-0.5), c.Bottom, c.Left+slot*0.5, c.Bottom)
	}
	now := int64(0)
	if len(minutes) > 0 {
		now = minutes[len(minutes)-1].Backlog
	}
	c.Title = "Backlog (pending and in-flight messages), last hour"
	c.Desc = fmt.Sprintf("Line, one point per minute %s: %d waiting now, at most %d. Reconstructed from arrivals and settled attempts.",
		span(minutes), now, peak)
	c.Empty, c.EmptyText = peak == 0, "Nothing waited in the last hour"
	return c
}
