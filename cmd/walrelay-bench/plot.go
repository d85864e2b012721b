package main

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// plot draws walrelay's p50, p99 and p99.9 commit-to-consume latency, and the
// raw receiver's p99 as the baseline, against the achieved load of the
// one-row loads, as an SVG with a logarithmic latency axis.
func plot(all []point) string {
	var points []point
	for _, p := range all {
		if p.rows == 1 {
			points = append(points, p)
		}
	}
	if len(points) == 0 {
		points = append(points, all...)
	}
	sort.Slice(points, func(i, j int) bool { return points[i].achieved < points[j].achieved })
	const w, h, left, bottom, top, right = 680.0, 380.0, 70.0, 50.0, 20.0, 130.0
	maxX := 0.0
	for _, p := range points {
		maxX = max(maxX, p.achieved)
	}
	maxX *= 1.05
	const lo, hi = 0.1, 10000.0 // milliseconds, the log axis
	x := func(v float64) float64 { return left + v/maxX*(w-left-right) }
	y := func(d time.Duration) float64 {
		ms := math.Min(math.Max(float64(d)/float64(time.Millisecond), lo), hi)
		return h - bottom - (math.Log10(ms)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))*(h-bottom-top)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", w, h)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	for _, ms := range []float64{0.1, 1, 10, 100, 1000, 10000} {
		yy := y(time.Duration(ms * float64(time.Millisecond)))
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/>`+"\n", left, yy, w-right, yy)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%g ms</text>`+"\n", left-6, yy+4, ms)
	}
	target := y(15 * time.Millisecond)
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#888" stroke-dasharray="4 3"/>`+"\n", left, target, w-right, target)
	fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" fill="#666">p99 target 15 ms</text>`+"\n", w-right+6, target+4)
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="black"/>`+"\n", left, h-bottom, w-right, h-bottom)
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="black"/>`+"\n", left, top, left, h-bottom)
	for _, p := range points {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%.0f</text>`+"\n", x(p.achieved), h-bottom+16, p.achieved)
	}
	series := []struct {
		name, color, dash string
		get               func(point) time.Duration
	}{
		{"walrelay p50", "#1f77b4", "", func(p point) time.Duration { return p.p50 }},
		{"walrelay p99", "#ff7f0e", "", func(p point) time.Duration { return p.p99 }},
		{"walrelay p99.9", "#d62728", "", func(p point) time.Duration { return p.p999 }},
		{"baseline p99", "#2ca02c", "6 4", func(p point) time.Duration { return p.base.p99 }},
	}
	for i, s := range series {
		var pts []string
		for _, p := range points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.achieved), y(s.get(p))))
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", x(p.achieved), y(s.get(p)), s.color)
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" stroke-dasharray="%s" points="%s"/>`+"\n", s.color, s.dash, strings.Join(pts, " "))
		ly := top + 14 + float64(i)*18
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="2" stroke-dasharray="%s"/>`+"\n", w-right+6, ly, w-right+26, ly, s.color, s.dash)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">%s</text>`+"\n", w-right+30, ly+4, s.name)
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">achieved one-row transactions per second (the last: unpaced writers)</text>`+"\n", (left+w-right)/2, h-14)
	b.WriteString("</svg>\n")
	return b.String()
}
