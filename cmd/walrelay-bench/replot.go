package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// replot reads the latency table of an earlier run's Markdown output and
// returns its points, so that the plot can be drawn again without a run.
func replot(path string) ([]point, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	parseMS := func(s string) time.Duration {
		s = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(s), "≤"))
		f, _ := strconv.ParseFloat(strings.TrimSuffix(s, " ms"), 64)
		return time.Duration(f * float64(time.Millisecond))
	}
	var points []point
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, "|")
		if len(f) < 13 || !strings.HasSuffix(strings.TrimSpace(f[4]), "ms") {
			continue
		}
		var p point
		p.rows, _ = strconv.Atoi(strings.TrimSpace(f[2]))
		p.achieved, _ = strconv.ParseFloat(strings.TrimSpace(f[3]), 64)
		p.offered, _ = strconv.ParseFloat(strings.TrimSpace(f[1]), 64) // 0 for the unpaced load
		p.p50, p.p99, p.p999 = parseMS(f[4]), parseMS(f[5]), parseMS(f[6])
		p.base = quantiles{parseMS(f[8]), parseMS(f[9]), parseMS(f[10])}
		points = append(points, p)
	}
	if len(points) == 0 {
		return nil, fmt.Errorf("%s has no latency table", path)
	}
	return points, nil
}
