package main

import (
	"fmt"
	"strings"
	"time"
)

// plot draws p50, p99 and p99.9 latency against offered load as an SVG,
// one line per transaction shape.
func plot(all []point) string {
	var points []point
	for _, p := range all {
		if p.rows == 1 {
			points = append(points, p)
		}
	}
	if len(points) == 0 {
		points = all
	}
	const w, h, left, bottom, top, right = 640.0, 360.0, 60.0, 40.0, 20.0, 20.0
	maxX, maxY := 0.0, 0.0
	for _, p := range points {
		maxX = max(maxX, p.offered)
		maxY = max(maxY, float64(p.p999)/float64(time.Millisecond))
	}
	maxY *= 1.1
	if maxY == 0 {
		maxY = 1
	}
	x := func(v float64) float64 { return left + v/maxX*(w-left-right) }
	y := func(d time.Duration) float64 {
		return h - bottom - float64(d)/float64(time.Millisecond)/maxY*(h-bottom-top)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="black"/>`+"\n", left, h-bottom, w-right, h-bottom)
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="black"/>`+"\n", left, top, left, h-bottom)
	for i := 0; i <= 4; i++ {
		v := maxY * float64(i) / 4
		yy := h - bottom - float64(i)/4*(h-bottom-top)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="end">%.1f ms</text>`+"\n", left-4, yy+4, v)
	}
	for _, p := range points {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">%.0f/s</text>`+"\n", x(p.offered), h-bottom+16, p.offered)
	}
	for _, s := range []struct {
		name, color string
		get         func(point) time.Duration
	}{{"p50", "#1f77b4", func(p point) time.Duration { return p.p50 }}, {"p99", "#ff7f0e", func(p point) time.Duration { return p.p99 }},
		{"p99.9", "#d62728", func(p point) time.Duration { return p.p999 }}} {
		var pts []string
		for _, p := range points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.offered), y(s.get(p))))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", s.color, strings.Join(pts, " "))
		last := points[len(points)-1]
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" fill="%s">%s</text>`+"\n", x(last.offered)-40, y(s.get(last))-6, s.color, s.name)
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">offered one-row transactions per second</text>`+"\n", (left+w-right)/2, h-6)
	b.WriteString("</svg>\n")
	return b.String()
}
