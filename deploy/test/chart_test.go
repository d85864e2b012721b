package test

import (
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const chartDir = "../helm/walrelay"

// render renders the chart as helm template would with the values files
// (each over the ones before it, as -f does) and then set.
func render(files []string, set map[string]any) (*objects, error) {
	out, err := renderTemplates(files, set)
	if err != nil {
		return nil, err
	}
	o := &objects{}
	for _, name := range slices.Sorted(maps.Keys(out)) {
		if strings.HasSuffix(name, "NOTES.txt") {
			continue
		}
		if err := o.add(name, out[name]); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// renderTemplates renders each template of the chart, NOTES.txt too, as
// render does.
func renderTemplates(files []string, set map[string]any) (map[string]string, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, err
	}
	vals := map[string]any{}
	for _, f := range files {
		v, err := common.ReadValuesFile(filepath.Join(chartDir, f))
		if err != nil {
			return nil, err
		}
		vals = mergeValues(vals, v)
	}
	vals = mergeValues(vals, set)
	rv, err := util.ToRenderValues(ch, vals, common.ReleaseOptions{Name: "walrelay", Namespace: "walrelay", IsInstall: true}, common.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	return engine.Render(ch, rv)
}

// mergeValues merges b into a as helm's -f and --set do: maps merge key by
// key, anything else in b replaces a's.
func mergeValues(a, b map[string]any) map[string]any {
	out := maps.Clone(a)
	for k, v := range b {
		if vm, ok := v.(map[string]any); ok {
			if am, ok := out[k].(map[string]any); ok {
				out[k] = mergeValues(am, vm)
				continue
			}
		}
		out[k] = v
	}
	return out
}

// TestChart renders the chart with each variant's values (and their
// combination, and the monitors on) and holds every render to the rules
// of the plain manifests (checkInstallation), and to what the variant is
// for: its relays, their replicas, exactly-once.
func TestChart(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		files       []string
		set         map[string]any
		relays      int
		replicas    int32
		exactlyOnce bool
		monitors    int
	}{
		{name: "default: one relay, one replica", files: []string{"values.yaml"}, relays: 1, replicas: 1},
		{name: "standby: two replicas, one waits", files: []string{"values.yaml", "values-standby.yaml"}, relays: 1, replicas: 2},
		{name: "exactly-once", files: []string{"values.yaml", "values-exactly-once.yaml"}, relays: 1, replicas: 1, exactlyOnce: true},
		{name: "sharded: a relay per shard", files: []string{"values.yaml", "values-sharded.yaml"}, relays: 2, replicas: 1},
		{name: "sharded in four, exactly-once, a standby each", files: []string{"values.yaml", "values-sharded.yaml", "values-exactly-once.yaml", "values-standby.yaml"},
			set: map[string]any{"sharding": map[string]any{"count": 4}}, relays: 4, replicas: 2, exactlyOnce: true},
		// The image's ENV sets WALRELAY_ADMIN_LISTEN, which wins over the
		// file: the chart sets it from adminPort too.
		{name: "another admin port", files: []string{"values.yaml", "values-standby.yaml"}, set: map[string]any{"adminPort": 9187}, relays: 1, replicas: 2},
		{name: "the PodMonitor and the ServiceMonitor", files: []string{"values.yaml", "values-sharded.yaml"},
			set:    map[string]any{"metrics": map[string]any{"podMonitor": map[string]any{"enabled": true}, "serviceMonitor": map[string]any{"enabled": true}}},
			relays: 2, replicas: 1, monitors: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o, err := render(tt.files, tt.set)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			relays, err := checkInstallation(o, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			if len(relays) != tt.relays || len(o.monitors) != tt.monitors {
				t.Fatalf("%d relays and %d monitors, want %d and %d", len(relays), len(o.monitors), tt.relays, tt.monitors)
			}
			for _, r := range relays {
				if r.d.Spec.Replicas == nil || *r.d.Spec.Replicas != tt.replicas || r.cfg.Kafka.ExactlyOnce != tt.exactlyOnce {
					t.Fatalf("Deployment %s: replicas %v, exactly_once %v; want %d, %v", r.d.Name, r.d.Spec.Replicas, r.cfg.Kafka.ExactlyOnce, tt.replicas, tt.exactlyOnce)
				}
			}
		})
	}
}

// TestChartRefuses: values that would install a broken relay fail the
// render, naming the value.
func TestChartRefuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		set  map[string]any
		want string
	}{
		{"one shard", map[string]any{"sharding": map[string]any{"enabled": true, "count": 1}}, "at '/sharding/count': minimum"}, // values.schema.json; the template's own check stays behind it
		{"a NetworkPolicy of no peers", map[string]any{"networkPolicy": map[string]any{"from": []any{}}}, "networkPolicy.from is empty"},
		{"a Secret's key without its name", map[string]any{"existingSecret": map[string]any{"name": ""}}, "existingSecret.name is empty"},
		{"SASL without a password", map[string]any{"existingSecret": map[string]any{"kafkaSaslPasswordKey": ""}}, "config.kafka.sasl.mechanism SCRAM-SHA-512 without a password"},
		{"a SASL password in values", map[string]any{"config": map[string]any{"kafka": map[string]any{"sasl": map[string]any{"password": "pw"}}}}, "config.kafka.sasl.password in plain text"},
		{"a schema registry password in values", map[string]any{"config": map[string]any{"kafka": map[string]any{"schema_registry": map[string]any{"password": "pw"}}}}, "config.kafka.schema_registry.password in plain text"},
		{"a password in the DSN", map[string]any{"config": map[string]any{"postgres": map[string]any{"dsn": "postgres://walrelay:pw@db-1.db:5432/app"}}}, "config.postgres.dsn holds a password"},
		{"a password in the DSN's keywords", map[string]any{"config": map[string]any{"postgres": map[string]any{"dsn": "host=db user=walrelay password=pw"}}}, "config.postgres.dsn holds a password"},
		{"a literal password in env", map[string]any{"env": []any{map[string]any{"name": "WALRELAY_POSTGRES_PASSWORD", "value": "pw"}}}, "env WALRELAY_POSTGRES_PASSWORD holds its value in plain text"},
		{"a literal DSN in env", map[string]any{"env": []any{map[string]any{"name": "WALRELAY_POSTGRES_DSN", "value": "postgres://walrelay@db/app"}}}, "env WALRELAY_POSTGRES_DSN holds its value in plain text"},
		{"a peer of every pod of the namespace", map[string]any{"networkPolicy": map[string]any{"from": []any{map[string]any{"podSelector": map[string]any{}}}}}, "networkPolicy.from[0] admits every pod"},
		{"a peer of every namespace", map[string]any{"networkPolicy": map[string]any{"from": []any{
			map[string]any{"ipBlock": map[string]any{"cidr": "10.0.0.0/8"}},
			map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{}}, "podSelector": map[string]any{}},
		}}}, "networkPolicy.from[1] admits every pod"},
		{"shards sharing a transactional id from env", map[string]any{"sharding": map[string]any{"enabled": true}, "env": []any{map[string]any{"name": "WALRELAY_KAFKA_TRANSACTIONAL_ID", "value": "walrelay"}}}, "env WALRELAY_KAFKA_TRANSACTIONAL_ID with sharding.enabled"},
		{"shards sharing a slot from env", map[string]any{"sharding": map[string]any{"enabled": true}, "env": []any{map[string]any{"name": "WALRELAY_POSTGRES_SLOT", "value": "walrelay"}}}, "env WALRELAY_POSTGRES_SLOT with sharding.enabled"},
		{"shards sharing a publication from env", map[string]any{"sharding": map[string]any{"enabled": true}, "env": []any{map[string]any{"name": "WALRELAY_POSTGRES_PUBLICATION", "value": "walrelay_outbox"}}}, "env WALRELAY_POSTGRES_PUBLICATION with sharding.enabled"},
		{"sharding.enabled as a string", map[string]any{"sharding": map[string]any{"enabled": "false"}}, "/sharding/enabled"},
		{"adminPort as a string", map[string]any{"adminPort": "8087"}, "/adminPort"},
		{"a shard's publication over 63 bytes", map[string]any{"sharding": map[string]any{"enabled": true}, "config": map[string]any{"postgres": map[string]any{"publication": strings.Repeat("p", 55)}}}, "over 63 bytes"},
		{"a shard's slot of capitals", map[string]any{"sharding": map[string]any{"enabled": true}, "config": map[string]any{"postgres": map[string]any{"slot": "Walrelay"}}}, "not lower-case letters, digits and underscores"},
		{"the admin listener from env", map[string]any{"env": []any{map[string]any{"name": "WALRELAY_ADMIN_LISTEN", "value": "0.0.0.0:9000"}}}, "set adminPort instead"},
		{"shards sharing a transactional id", map[string]any{"sharding": map[string]any{"enabled": true}, "config": map[string]any{"kafka": map[string]any{"transactional_id": "walrelay"}}}, "config.kafka.transactional_id with sharding.enabled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := render([]string{"values.yaml"}, tt.set)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("render: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestShardCountNamesNewSlots: another sharding.count names other slots as
// well as other publications, so an upgrade that changes the count never
// starts an existing slot on a new publication (walrelay refuses a slot
// whose position is before its publication's creation).
func TestShardCountNamesNewSlots(t *testing.T) {
	t.Parallel()
	slots := map[string]int{}
	for _, n := range []int{2, 3} {
		o, err := render([]string{"values.yaml", "values-sharded.yaml"}, map[string]any{"sharding": map[string]any{"count": n}})
		if err != nil {
			t.Fatalf("render: %v", err)
		}
		relays, err := checkInstallation(o, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range relays {
			if other, ok := slots[r.cfg.Postgres.Slot]; ok {
				t.Fatalf("slot %s in %d shards and in %d: an upgrade would start it on publication %s", r.cfg.Postgres.Slot, other, n, r.cfg.Postgres.Publication)
			}
			slots[r.cfg.Postgres.Slot] = n
		}
	}
}

// TestChartNotes: the notes warn when no NetworkPolicy guards the admin
// port, and only then.
func TestChartNotes(t *testing.T) {
	t.Parallel()
	for _, enabled := range []bool{true, false} {
		out, err := renderTemplates([]string{"values.yaml"}, map[string]any{"networkPolicy": map[string]any{"enabled": enabled}})
		if err != nil {
			t.Fatalf("render: %v", err)
		}
		notes := out["walrelay/templates/NOTES.txt"]
		if warned := strings.Contains(notes, "WARNING: networkPolicy.enabled is false"); warned == enabled {
			t.Errorf("networkPolicy.enabled %v: notes warn %v:\n%s", enabled, warned, notes)
		}
	}
}

// TestRulesRefuse breaks a rendered chart one way at a time and expects
// the rule that guards against it to refuse it: each rule of
// checkInstallation can fail.
func TestRulesRefuse(t *testing.T) {
	t.Parallel()
	standby := []string{"values.yaml", "values-standby.yaml"}
	sharded := []string{"values.yaml", "values-sharded.yaml"}
	monitors := map[string]any{"metrics": map[string]any{"podMonitor": map[string]any{"enabled": true}, "serviceMonitor": map[string]any{"enabled": true}}}
	config := func(o *objects, old, new string) {
		for _, cm := range o.cms {
			cm.Data["walrelay.yaml"] = strings.Replace(cm.Data["walrelay.yaml"], old, new, 1)
		}
	}
	container := func(o *objects) *corev1.Container { return &o.deps[0].Spec.Template.Spec.Containers[0] }
	tests := []struct {
		name   string
		files  []string
		set    map[string]any
		breaks func(o *objects)
		want   string
	}{
		{"an unknown key", standby, nil, func(o *objects) { config(o, "shutdown_timeout:", "shutdown_timout:") }, "walrelay refuses ConfigMap"},
		{"a password in the DSN", standby, nil, func(o *objects) { config(o, "dsn: postgres://walrelay@", "dsn: postgres://walrelay:pw@") }, "postgres.dsn holds a password"},
		{"a password in the DSN's keywords", standby, nil, func(o *objects) {
			config(o, "dsn: postgres://walrelay@db-1.db:5432,db-2.db:5432/app?sslmode=verify-full&target_session_attrs=read-write", "dsn: host=db-1.db user=walrelay password=pw dbname=app")
		}, "postgres.dsn holds a password"},
		{"a SASL password in the ConfigMap", standby, nil, func(o *objects) {
			config(o, "password_file: /run/secrets/walrelay/kafka-sasl-password", "password: pw")
		}, "kafka.sasl.password in plain text"},
		{"a schema registry password in the ConfigMap", standby, nil, func(o *objects) {
			config(o, "  sasl:\n", "  schema_registry:\n    password: pw\n  sasl:\n")
		}, "kafka.schema_registry.password in plain text"},
		{"a literal password in env", standby, nil, func(o *objects) {
			container(o).Env = append(container(o).Env, corev1.EnvVar{Name: "WALRELAY_KAFKA_SASL_PASSWORD", Value: "pw"})
		}, "env WALRELAY_KAFKA_SASL_PASSWORD holds its value in plain text"},
		{"a literal DSN in env", standby, nil, func(o *objects) {
			container(o).Env = append(container(o).Env, corev1.EnvVar{Name: "WALRELAY_POSTGRES_DSN", Value: "postgres://walrelay@db/app"})
		}, "env WALRELAY_POSTGRES_DSN holds its value in plain text"},
		{"SASL without a password", standby, nil, func(o *objects) {
			for _, cm := range o.cms {
				var kept strings.Builder
				for line := range strings.Lines(cm.Data["walrelay.yaml"]) {
					if !strings.Contains(line, "password_file: /run/secrets/walrelay/kafka-sasl-password") {
						kept.WriteString(line)
					}
				}
				cm.Data["walrelay.yaml"] = kept.String()
			}
		}, "needs kafka.sasl.username and a password"},
		{"a variable of no key", standby, nil, func(o *objects) {
			container(o).Env = append(container(o).Env, corev1.EnvVar{Name: "WALRELAY_POSTGRES_SLOTS", Value: "x"})
		}, "names no walrelay key"},
		{"a password file outside the Secret", standby, nil, func(o *objects) {
			v := &o.deps[0].Spec.Template.Spec.Volumes[1]
			v.Secret.Items = v.Secret.Items[:1]
		}, "has no item of that path"},
		{"admin on loopback", standby, nil, func(o *objects) {
			for i, e := range container(o).Env {
				if e.Name == "WALRELAY_ADMIN_LISTEN" {
					container(o).Env[i].Value = "127.0.0.1:8087"
				}
			}
		}, "want all interfaces"},
		{"the image's admin listener over the file's", standby, map[string]any{"adminPort": 9187}, func(o *objects) {
			container(o).Env = slices.DeleteFunc(container(o).Env, func(e corev1.EnvVar) bool { return e.Name == "WALRELAY_ADMIN_LISTEN" })
		}, "want admin.listen's 8087"},
		{"readiness without standby", standby, nil, func(o *objects) { container(o).ReadinessProbe.HTTPGet.Path = "/readyz" }, "readiness probe"},
		{"no scrape annotations", standby, nil, func(o *objects) { delete(o.deps[0].Spec.Template.Annotations, "prometheus.io/port") }, "scrape annotations"},
		{"a request under the peak", standby, nil, func(o *objects) { container(o).Resources.Requests[corev1.ResourceMemory] = resource.MustParse("48Mi") }, "memory request"},
		{"a limit under memory_limit + 64 MiB", standby, nil, func(o *objects) { container(o).Resources.Limits[corev1.ResourceMemory] = resource.MustParse("80Mi") }, "memory limit"},
		{"buffers raised and the limit not", standby, map[string]any{"config": map[string]any{"kafka": map[string]any{"max_buffered_bytes": 64 << 20}}}, func(*objects) {}, "memory limit"},
		{"a grace period the stop does not fit", standby, nil, func(o *objects) { config(o, "shutdown_timeout: 20s", "shutdown_timeout: 28s") }, "grace period"},
		{"a writable root filesystem", standby, nil, func(o *objects) { container(o).SecurityContext.ReadOnlyRootFilesystem = nil }, "read-only root filesystem"},
		{"a service account token mounted", standby, nil, func(o *objects) { o.deps[0].Spec.Template.Spec.AutomountServiceAccountToken = nil }, "automountServiceAccountToken"},
		{"an update that stops both", standby, nil, func(o *objects) {
			two := intstr.FromInt32(2)
			o.deps[0].Spec.Strategy.RollingUpdate.MaxUnavailable = &two
		}, "stops every pod of the slot"},
		{"a budget that holds a drain while Kafka is down", standby, nil, func(o *objects) { o.pdbs[0].Spec.UnhealthyPodEvictionPolicy = nil }, "want AlwaysAllow"},
		{"two replicas without a budget", standby, nil, func(o *objects) { o.pdbs = nil }, "want one"},
		{"a budget on one replica", []string{"values.yaml"}, nil, func(o *objects) {
			standby, err := render([]string{"values.yaml", "values-standby.yaml"}, nil)
			if err != nil {
				panic(err)
			}
			o.pdbs = standby.pdbs
		}, "blocks every node drain"},
		{"a budget over two shards", []string{"values.yaml", "values-sharded.yaml", "values-standby.yaml"}, nil, func(o *objects) {
			delete(o.pdbs[0].Spec.Selector.MatchLabels, "walrelay.io/shard")
		}, "selects the pods of Deployments"},
		{"a Deployment selecting another shard's pods", sharded, nil, func(o *objects) {
			delete(o.deps[0].Spec.Selector.MatchLabels, "walrelay.io/shard")
		}, "selects the pods of Deployment"},
		{"two shards on one slot", sharded, nil, func(o *objects) { config(o, "slot: walrelay_shard_1_of_2", "slot: walrelay_shard_0_of_2") }, "both stream slot"},
		{"a shard without allow_row_filter", sharded, nil, func(o *objects) { config(o, "allow_row_filter: true", "allow_row_filter: false") }, "allow_row_filter is off"},
		{"two shards on one transactional id from env", sharded, nil, func(o *objects) {
			for _, d := range o.deps {
				c := &d.Spec.Template.Spec.Containers[0]
				c.Env = append(c.Env, corev1.EnvVar{Name: "WALRELAY_KAFKA_TRANSACTIONAL_ID", Value: "walrelay"})
			}
		}, "share kafka.transactional_id"},
		{"two shards on one publication", sharded, nil, func(o *objects) { config(o, "shard_1_of_2", "shard_0_of_2") }, "read one publication"},
		{"the waiting replica unpublished", standby, nil, func(o *objects) { o.svcs[0].Spec.PublishNotReadyAddresses = false }, "publishNotReadyAddresses"},
		{"no NetworkPolicy", standby, nil, func(o *objects) { o.nps = nil }, "want one: the admin port has no authentication"},
		{"a NetworkPolicy admitting everyone", standby, nil, func(o *objects) { o.nps[0].Spec.Ingress[0].From = nil }, "admits every peer"},
		{"a NetworkPolicy admitting every pod of its namespace", standby, nil, func(o *objects) {
			o.nps[0].Spec.Ingress[0].From = []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}
		}, "admits every pod of a namespace"},
		{"a NetworkPolicy admitting another port", standby, nil, func(o *objects) {
			p := intstr.FromInt32(9090)
			o.nps[0].Spec.Ingress[0].Ports[0].Port = &p
		}, "want the admin port"},
		{"a PodMonitor on another path", sharded, monitors, func(o *objects) { o.monitors[0].Spec.PodMetricsEndpoints[0].Path = "/status" }, "want /metrics"},
		{"a ServiceMonitor of no Service", sharded, monitors, func(o *objects) { o.monitors[1].Spec.Selector.MatchLabels = map[string]string{"app": "x"} }, "want the admin Service"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o, err := render(tt.files, nil)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			if _, err := checkInstallation(o, t.TempDir()); err != nil {
				t.Fatalf("before breaking it: %v", err)
			}
			// Broken by values, or in the render.
			if o, err = render(tt.files, tt.set); err != nil {
				t.Fatalf("render: %v", err)
			}
			tt.breaks(o)
			_, err = checkInstallation(o, t.TempDir())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("checkInstallation: %v, want an error containing %q", err, tt.want)
			}
			t.Log(err)
		})
	}
}

// TestChartLint runs helm lint --strict (Helm's own lint action, the code
// of the helm command) on the chart with each variant's values and all of
// them together: no warning and no error. The INFO that the chart has no
// icon is not a warning.
func TestChartLint(t *testing.T) {
	t.Parallel()
	for _, files := range [][]string{
		nil,
		{"values-standby.yaml"},
		{"values-exactly-once.yaml"},
		{"values-sharded.yaml"},
		{"values-sharded.yaml", "values-exactly-once.yaml", "values-standby.yaml"},
	} {
		vals := map[string]any{}
		for _, f := range files {
			v, err := common.ReadValuesFile(filepath.Join(chartDir, f))
			if err != nil {
				t.Fatal(err)
			}
			vals = mergeValues(vals, v)
		}
		lint := action.NewLint()
		lint.Strict = true
		res := lint.Run([]string{chartDir}, vals)
		if res.TotalChartsLinted != 1 || len(res.Errors) > 0 {
			t.Errorf("helm lint --strict with %v: %d charts linted, errors %v, messages %v", files, res.TotalChartsLinted, res.Errors, res.Messages)
		}
	}
}
