package test

import (
	"bytes"
	"flag"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/walrelay/walrelay/config"
)

// manifests reads every document of deploy/kubernetes into its API type,
// strictly: a field the type lacks (a typo, a wrong level) fails.
func manifests(t *testing.T) (deps []*appsv1.Deployment, cms map[string]*corev1.ConfigMap, pdbs []*policyv1.PodDisruptionBudget, svcs []*corev1.Service, nps []*networkingv1.NetworkPolicy) {
	t.Helper()
	files, err := filepath.Glob("../kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	cms = map[string]*corev1.ConfigMap{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range bytes.Split(b, []byte("\n---\n")) {
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				t.Fatalf("%s document %d: %v", f, i+1, err)
			}
			var obj any
			switch tm.APIVersion + " " + tm.Kind {
			case "apps/v1 Deployment":
				d := &appsv1.Deployment{}
				deps, obj = append(deps, d), d
			case "v1 ConfigMap":
				obj = &corev1.ConfigMap{}
			case "policy/v1 PodDisruptionBudget":
				p := &policyv1.PodDisruptionBudget{}
				pdbs, obj = append(pdbs, p), p
			case "v1 Service":
				s := &corev1.Service{}
				svcs, obj = append(svcs, s), s
			case "networking.k8s.io/v1 NetworkPolicy":
				n := &networkingv1.NetworkPolicy{}
				nps, obj = append(nps, n), n
			default:
				t.Fatalf("%s document %d: kind %q %q is not one this test knows", f, i+1, tm.APIVersion, tm.Kind)
			}
			if err := yaml.UnmarshalStrict(doc, obj); err != nil {
				t.Fatalf("%s document %d (%s): %v", f, i+1, tm.Kind, err)
			}
			if c, ok := obj.(*corev1.ConfigMap); ok {
				cms[c.Name] = c
			}
		}
	}
	return deps, cms, pdbs, svcs, nps
}

// TestKubernetesManifests: the Deployment runs two replicas of walrelay run
// on a configuration that walrelay loads (every key known, every value
// valid); its probes ask the admin listener's port for /healthz and
// /readyz?standby=1; the secrets' files are where the configuration reads
// them; the stop fits the grace period; the budget and the Service select
// its pods; a NetworkPolicy lets only selected peers reach the admin port.
func TestKubernetesManifests(t *testing.T) {
	deps, cms, pdbs, svcs, nps := manifests(t)
	if len(deps) != 1 || len(pdbs) != 1 || len(svcs) != 1 || len(nps) != 1 {
		t.Fatalf("want one Deployment, PodDisruptionBudget, Service and NetworkPolicy: %d, %d, %d, %d", len(deps), len(pdbs), len(svcs), len(nps))
	}
	d := deps[0]
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Fatalf("replicas %v, want 2 (one streams, one waits)", d.Spec.Replicas)
	}
	pod := d.Spec.Template
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if len(c.Args) != 3 || c.Args[0] != "run" || c.Args[1] != "--config" {
		t.Fatalf("args %q, want run --config FILE", c.Args)
	}
	mounts := map[string]corev1.Volume{} // mount path -> volume
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Spec.Volumes {
			if v.Name == m.Name {
				mounts[m.MountPath] = v
			}
		}
	}
	// The configuration file: a key of the mounted ConfigMap.
	file := c.Args[2]
	v, ok := mounts[filepath.Dir(file)]
	if !ok || v.ConfigMap == nil {
		t.Fatalf("%s is not in a mounted ConfigMap", file)
	}
	cm, ok := cms[v.ConfigMap.Name]
	if !ok {
		t.Fatalf("ConfigMap %s is not in the manifests", v.ConfigMap.Name)
	}
	text, ok := cm.Data[filepath.Base(file)]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s", cm.Name, filepath.Base(file))
	}
	path := filepath.Join(t.TempDir(), "walrelay.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	cs := config.NewSet(fs)
	if err := fs.Parse([]string{"--config", path}); err != nil {
		t.Fatal(err)
	}
	// Load validates every key; the secrets' files are not here, so they
	// are checked below instead of read.
	cfg := cs.Config()
	if err := cs.LoadFile(path); err != nil {
		t.Fatalf("walrelay refuses the ConfigMap's configuration: %v", err)
	}
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, "WALRELAY_") && !knownVariable(e.Name) {
			t.Fatalf("env %s names no walrelay key", e.Name)
		}
	}
	// The secrets: each *_file key is a file of a mounted Secret.
	for key, p := range map[string]string{"postgres.password_file": cfg.Postgres.PasswordFile, "kafka.sasl.password_file": cfg.Kafka.SASL.PasswordFile} {
		if p == "" {
			continue
		}
		v, ok := mounts[filepath.Dir(p)]
		if !ok || v.Secret == nil {
			t.Fatalf("%s %s is not in a mounted Secret", key, p)
		}
		found := len(v.Secret.Items) == 0
		for _, it := range v.Secret.Items {
			found = found || it.Path == filepath.Base(p)
		}
		if !found {
			t.Fatalf("%s %s: Secret %s has no item of that path", key, p, v.Secret.SecretName)
		}
	}
	// The whole configuration validated as run validates it, with the
	// secrets' files put in a directory of the test.
	secrets := t.TempDir()
	full := text
	for mountPath, v := range mounts {
		if v.Secret == nil {
			continue
		}
		for _, it := range v.Secret.Items {
			if err := os.WriteFile(filepath.Join(secrets, it.Path), []byte("secret\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		full = strings.ReplaceAll(full, mountPath+"/", secrets+"/")
	}
	fullPath := filepath.Join(t.TempDir(), "walrelay.yaml")
	if err := os.WriteFile(fullPath, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	fs2 := flag.NewFlagSet("run", flag.ContinueOnError)
	cs2 := config.NewSet(fs2)
	if err := fs2.Parse([]string{"--config", fullPath}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs2.Load(fs2, true); err != nil {
		t.Fatalf("walrelay run would refuse the ConfigMap's configuration: %v", err)
	}

	// The admin listener: reachable from outside the pod, on the port the
	// probes and the Service use.
	host, port, err := net.SplitHostPort(cfg.Admin.Listen)
	if err != nil || (host != "0.0.0.0" && host != "" && host != "::") {
		t.Fatalf("admin.listen %q: want all interfaces, else the kubelet cannot probe it", cfg.Admin.Listen)
	}
	if len(c.Ports) != 1 || strconv.Itoa(int(c.Ports[0].ContainerPort)) != port {
		t.Fatalf("container ports %+v, want admin.listen's %s", c.Ports, port)
	}
	portName := c.Ports[0].Name
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		want := map[string]string{"liveness": "/healthz", "readiness": "/readyz?standby=1"}[name]
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != want || p.HTTPGet.Port.String() != portName && p.HTTPGet.Port.String() != port {
			t.Fatalf("%s probe %+v, want GET %s on the admin port", name, p, want)
		}
	}
	if pod.Annotations["prometheus.io/port"] != port || pod.Annotations["prometheus.io/path"] != "/metrics" {
		t.Fatalf("scrape annotations %v", pod.Annotations)
	}
	// Resources: requests sized from the measured RSS (under 64 MiB).
	if m := c.Resources.Requests.Memory(); m.IsZero() || m.Value() < 64<<20 {
		t.Fatalf("memory request %v, want at least the 64 MiB walrelay peaks under", m)
	}
	// The Go soft limit bounds the runtime's memory only; the binary's
	// code (about 27 MiB resident) comes on top, and the limit is soft: a
	// large event passes it for a moment (TestLargeEventsBoundedMemory).
	if lim := c.Resources.Limits.Memory(); lim.IsZero() || lim.Value() < cfg.SoftMemoryLimit()+64<<20 {
		t.Fatalf("memory limit %v, want at least the Go soft limit %d and 64 MiB for the binary's code and the limit's overshoot", lim, cfg.SoftMemoryLimit())
	}
	grace := time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	if cfg.ShutdownTimeout+5*time.Second > grace {
		t.Fatalf("shutdown_timeout %s leaves under 5 s of the grace period %s", cfg.ShutdownTimeout, grace)
	}
	if c.SecurityContext == nil || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem ||
		pod.Spec.SecurityContext == nil || pod.Spec.SecurityContext.RunAsNonRoot == nil || !*pod.Spec.SecurityContext.RunAsNonRoot {
		t.Fatal("want a non-root pod with a read-only root filesystem")
	}
	labels := pod.Labels
	selects := func(what string, sel map[string]string) {
		t.Helper()
		if len(sel) == 0 {
			t.Fatalf("%s selects nothing", what)
		}
		for k, v := range sel {
			if labels[k] != v {
				t.Fatalf("%s selects %s=%s, which the pods lack", what, k, v)
			}
		}
	}
	selects("the Deployment", d.Spec.Selector.MatchLabels)
	p := pdbs[0]
	selects("the PodDisruptionBudget", p.Spec.Selector.MatchLabels)
	if p.Spec.MinAvailable == nil || p.Spec.MinAvailable.IntValue() != 1 {
		t.Fatalf("PodDisruptionBudget minAvailable %v, want 1", p.Spec.MinAvailable)
	}
	s := svcs[0]
	selects("the Service", s.Spec.Selector)
	if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].TargetPort.String() != portName || !s.Spec.PublishNotReadyAddresses {
		t.Fatalf("Service ports %+v (want the admin port, and the waiting replica published too)", s.Spec.Ports)
	}
	// The NetworkPolicy: it selects the pods and filters their ingress;
	// each rule names its peers (an empty from admits everyone) and admits
	// the admin port alone.
	np := nps[0]
	selects("the NetworkPolicy", np.Spec.PodSelector.MatchLabels)
	ingress := false
	for _, pt := range np.Spec.PolicyTypes {
		ingress = ingress || pt == networkingv1.PolicyTypeIngress
	}
	if !ingress || len(np.Spec.Ingress) == 0 {
		t.Fatalf("NetworkPolicy policyTypes %v, ingress %d rules: want Ingress filtered, with a rule for the scraper", np.Spec.PolicyTypes, len(np.Spec.Ingress))
	}
	for i, rule := range np.Spec.Ingress {
		if len(rule.From) == 0 {
			t.Fatalf("NetworkPolicy ingress rule %d has no from: it admits every peer", i)
		}
		for _, peer := range rule.From {
			if peer.IPBlock == nil && (peer.PodSelector == nil || len(peer.PodSelector.MatchLabels)+len(peer.PodSelector.MatchExpressions) == 0) &&
				(peer.NamespaceSelector == nil || len(peer.NamespaceSelector.MatchLabels)+len(peer.NamespaceSelector.MatchExpressions) == 0) {
				t.Fatalf("NetworkPolicy ingress rule %d admits every pod of a namespace or every namespace: %+v", i, peer)
			}
		}
		if len(rule.Ports) == 0 {
			t.Fatalf("NetworkPolicy ingress rule %d admits every port", i)
		}
		for _, p := range rule.Ports {
			if p.Port == nil || (p.Port.String() != portName && p.Port.String() != port) {
				t.Fatalf("NetworkPolicy ingress rule %d admits port %v, want the admin port %s alone", i, p.Port, portName)
			}
		}
	}
}

// knownVariable reports whether name is the variable of a walrelay key.
func knownVariable(name string) bool {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	config.NewSet(fs)
	known := false
	fs.VisitAll(func(f *flag.Flag) { known = known || config.EnvName(f.Name) == name })
	return known
}
