package main

import (
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPlotIsWellFormedSVG(t *testing.T) {
	md := `| 1000 | 1 | 998 | 4.5 ms | 8.0 ms | 9.7 ms | ≤ 10.0 ms | 0.2 ms | 3.3 ms | 5.9 ms | 0.18 cores | 45% |
| 10000 | 10 | 9982 | 5.3 ms | 22.0 ms | 29.2 ms | ≤ 25.0 ms | 0.5 ms | 128.9 ms | 138.4 ms | 0.31 cores | 65% |
| unpaced (16 writers) | 1 | 5487 | 932.5 ms | 1487.8 ms | 1501.7 ms | ≤ 2500.0 ms | 11.0 ms | 600.4 ms | 624.2 ms | 0.16 cores | 99% |
`
	path := filepath.Join(t.TempDir(), "bench.md")
	if err := os.WriteFile(path, []byte(md), 0o600); err != nil {
		t.Fatal(err)
	}
	points, err := replot(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(points) != 3 || points[1].rows != 10 || points[0].p99 != 8*time.Millisecond || points[2].base.p99 != 600400*time.Microsecond {
		t.Fatalf("points %+v", points)
	}
	svg := plot(points)
	d := xml.NewDecoder(strings.NewReader(svg))
	for {
		if _, err := d.Token(); err != nil {
			if err.Error() == "EOF" {
				break
			}
			t.Fatalf("not well-formed: %v\n%s", err, svg)
		}
	}
	if strings.Count(svg, "<polyline") != 4 || !strings.Contains(svg, "p99 target 15 ms") {
		t.Fatalf("want four series and the target line:\n%s", svg)
	}
}
