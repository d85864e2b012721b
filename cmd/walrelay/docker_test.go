package main

import (
	"flag"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/walrelay/walrelay/config"
)

// composeFile is the part of docker-compose.yml the test reads.
type composeFile struct {
	Services map[string]struct {
		Image       string
		Build       any
		PullPolicy  string `yaml:"pull_policy"`
		Command     []string
		Environment map[string]string
		Ports       []string
		Volumes     []string
		Restart     string
		Healthcheck *struct {
			Test []string
		}
		DependsOn map[string]struct {
			Condition string
		} `yaml:"depends_on"`
	}
}

// TestComposeAndDockerfile checks docker-compose.yml and the Dockerfile
// against walrelay and the repository, since no Docker engine runs here:
// every dependency waits for a health check (or a one-shot's success);
// PostgreSQL's check goes over TCP as walrelay's role and database; Kafka's
// makes a metadata request; walrelay's asks /readyz; migrate runs the image
// that walrelay's service builds, built once; every WALRELAY_ variable names
// a key; every port is bound to loopback; the mounted files exist, and
// Prometheus scrapes walrelay's admin port and loads the rules Grafana's
// provisioning and dashboard sit where Grafana reads them. The Dockerfile
// builds a static, stamped binary into a non-root image whose entrypoint is
// walrelay, with a health check and the admin port exposed.
func TestComposeAndDockerfile(t *testing.T) {
	b, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	for _, need := range []string{"postgres", "kafka", "migrate", "walrelay", "prometheus", "grafana"} {
		if _, ok := c.Services[need]; !ok {
			t.Fatalf("no service %s", need)
		}
	}
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	config.NewSet(fs)
	known := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { known[config.EnvName(f.Name)] = true })
	builds := 0
	for name, s := range c.Services {
		for dep, d := range s.DependsOn {
			target, ok := c.Services[dep]
			switch {
			case !ok:
				t.Fatalf("%s depends on %s, which is no service", name, dep)
			case d.Condition == "service_healthy" && target.Healthcheck == nil:
				t.Fatalf("%s waits for %s to be healthy, which has no health check", name, dep)
			case d.Condition == "service_completed_successfully" && target.Restart != "":
				t.Fatalf("%s waits for %s to complete, which restarts", name, dep)
			case d.Condition != "service_healthy" && d.Condition != "service_completed_successfully":
				t.Fatalf("%s depends on %s with condition %q: want service_healthy or service_completed_successfully", name, dep, d.Condition)
			}
		}
		for k := range s.Environment {
			if strings.HasPrefix(k, "WALRELAY_") && !known[k] {
				t.Fatalf("%s: %s names no walrelay key", name, k)
			}
		}
		for _, p := range s.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Fatalf("%s publishes %s beyond loopback", name, p)
			}
		}
		for _, v := range s.Volumes {
			if src, _, _ := strings.Cut(v, ":"); strings.HasPrefix(src, "./") {
				if _, err := os.Stat(filepath.Join("../..", src)); err != nil {
					t.Fatalf("%s mounts %s: %v", name, src, err)
				}
			}
		}
		if s.Build != nil {
			builds++
		}
	}
	if builds != 1 {
		t.Fatalf("%d services build an image: want walrelay's alone (migrate runs it)", builds)
	}
	w, m := c.Services["walrelay"], c.Services["migrate"]
	if w.Image == "" || m.Image != w.Image || m.Build != nil || m.PullPolicy != "never" || !slices.Equal(m.Command, []string{"migrate"}) {
		t.Fatalf("migrate: image %q pull_policy %q command %q; want walrelay's image %q, never pulled, command migrate", m.Image, m.PullPolicy, m.Command, w.Image)
	}
	// The image it builds is stamped: the Dockerfile's build arguments.
	if b, _ := w.Build.(map[string]any); b == nil || b["args"] == nil {
		t.Fatalf("walrelay's build %v passes no build arguments: its image would say version dev", w.Build)
	} else {
		args, _ := b["args"].(map[string]any)
		for _, arg := range []string{"VERSION", "COMMIT", "BUILD_DATE"} {
			if v, _ := args[arg].(string); !strings.Contains(v, "${"+arg) {
				t.Errorf("walrelay's build argument %s is %q: want it from the environment (${%s:-…})", arg, v, arg)
			}
		}
	}
	if w.Healthcheck == nil || !slices.Equal(w.Healthcheck.Test, []string{"CMD", "/walrelay", "status", "--ready"}) {
		t.Fatalf("walrelay's health check %v: want walrelay status --ready (/readyz)", w.Healthcheck)
	}
	dsn, err := url.Parse(w.Environment["WALRELAY_POSTGRES_DSN"])
	if err != nil {
		t.Fatal(err)
	}
	pgCheck := strings.Join(c.Services["postgres"].Healthcheck.Test, " ")
	if !strings.Contains(pgCheck, "-h 127.0.0.1") || !strings.Contains(pgCheck, "-U "+dsn.User.Username()) || !strings.Contains(pgCheck, "-d "+strings.TrimPrefix(dsn.Path, "/")) {
		t.Fatalf("postgres health check %q: want TCP (-h), walrelay's role and database", pgCheck)
	}
	if kc := strings.Join(c.Services["kafka"].Healthcheck.Test, " "); !strings.Contains(kc, "kafka-broker-api-versions.sh --bootstrap-server") {
		t.Fatalf("kafka health check %q: want a metadata request", kc)
	}
	_, adminPort, err := net.SplitHostPort(w.Environment["WALRELAY_ADMIN_LISTEN"])
	if err != nil {
		t.Fatal(err)
	}

	// Prometheus scrapes walrelay's admin port and loads the mounted rules.
	var prom struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			StaticConfigs []struct{ Targets []string } `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, "../../deploy/prometheus/prometheus.yml", &prom)
	if len(prom.ScrapeConfigs) != 1 || len(prom.ScrapeConfigs[0].StaticConfigs) != 1 ||
		!slices.Equal(prom.ScrapeConfigs[0].StaticConfigs[0].Targets, []string{"walrelay:" + adminPort}) {
		t.Fatalf("Prometheus scrapes %+v: want walrelay:%s", prom.ScrapeConfigs, adminPort)
	}
	mounted := func(service, target string) string {
		for _, v := range c.Services[service].Volumes {
			parts := strings.Split(v, ":")
			if len(parts) >= 2 && parts[1] == target {
				return parts[0]
			}
		}
		return ""
	}
	for _, rf := range prom.RuleFiles {
		if src := mounted("prometheus", rf); src != "./deploy/prometheus/walrelay-rules.yml" {
			t.Fatalf("rule file %s is mounted from %q", rf, src)
		}
	}
	// Grafana: the data source is the stack's Prometheus; the dashboards
	// provider reads the directory the dashboard is mounted in.
	var dash struct {
		Providers []struct{ Options struct{ Path string } }
	}
	readYAML(t, "../../deploy/grafana/provisioning/dashboards/walrelay.yml", &dash)
	if len(dash.Providers) != 1 || mounted("grafana", dash.Providers[0].Options.Path+"/walrelay.json") != "./deploy/grafana/walrelay.json" {
		t.Fatalf("the dashboards provider reads %+v, where deploy/grafana/walrelay.json is not mounted", dash.Providers)
	}
	var ds struct {
		Datasources []struct{ URL string }
	}
	readYAML(t, "../../deploy/grafana/provisioning/datasources/prometheus.yml", &ds)
	if len(ds.Datasources) != 1 || ds.Datasources[0].URL != "http://prometheus:9090" {
		t.Fatalf("Grafana's data source %+v: want the stack's Prometheus", ds.Datasources)
	}

	// The Dockerfile.
	b, err = os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	final := df[strings.LastIndex(df, "\nFROM "):]
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.version=", "-X main.commit=", "-X main.buildDate="} {
		if !strings.Contains(df, want) {
			t.Fatalf("the Dockerfile's build lacks %s", want)
		}
	}
	for _, want := range []string{"USER nonroot", "EXPOSE " + adminPort, `ENTRYPOINT ["/walrelay"]`, `HEALTHCHECK `, `CMD ["/walrelay", "status", "--ready"]`} {
		if !strings.Contains(final, want) {
			t.Fatalf("the Dockerfile's runtime stage lacks %s", want)
		}
	}
	ignore, err := os.ReadFile("../../.dockerignore")
	if err != nil || !slices.Contains(strings.Split(string(ignore), "\n"), ".git") {
		t.Fatalf(".dockerignore must keep .git out of the build context: %v", err)
	}
	_, _, _ = version, commit, buildDate // the variables the ldflags set
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
