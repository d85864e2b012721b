package test

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/walrelay/walrelay/config"
)

// The rules that every installation of walrelay on Kubernetes keeps, the
// plain manifests and the chart's every variant alike: each returns an
// error naming the object and what it lacks.

// relay is one Deployment of walrelay with what its pods run: the
// container, its configuration as walrelay loads it, its volumes by mount
// path, and the admin port's number and name.
type relay struct {
	d        *appsv1.Deployment
	c        corev1.Container
	cfg      *config.Config
	mounts   map[string]corev1.Volume
	port     string
	portName string
}

// loadRelay reads d's configuration as walrelay run would: the file that
// --config names is a key of a mounted ConfigMap; walrelay knows every key
// and value of it, and every WALRELAY_ variable of the container; the
// environment (the image's ENV under the container's env) overrides the
// file; each *_password_file is a file of a mounted Secret; and the whole
// configuration, with the secrets' files put under dir, passes run's
// validation and its mapping onto the relay's configuration (the Kafka
// security checks among them).
func loadRelay(o *objects, d *appsv1.Deployment, dir string) (*relay, error) {
	pod := d.Spec.Template
	if len(pod.Spec.Containers) != 1 {
		return nil, fmt.Errorf("Deployment %s: %d containers, want walrelay alone", d.Name, len(pod.Spec.Containers))
	}
	r := &relay{d: d, c: pod.Spec.Containers[0], mounts: map[string]corev1.Volume{}}
	c := r.c
	if len(c.Args) != 3 || c.Args[0] != "run" || c.Args[1] != "--config" {
		return nil, fmt.Errorf("Deployment %s: args %q, want run --config FILE", d.Name, c.Args)
	}
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Spec.Volumes {
			if v.Name == m.Name {
				r.mounts[m.MountPath] = v
			}
		}
	}
	file := c.Args[2]
	v, ok := r.mounts[filepath.Dir(file)]
	if !ok || v.ConfigMap == nil {
		return nil, fmt.Errorf("Deployment %s: %s is not in a mounted ConfigMap", d.Name, file)
	}
	cm, ok := o.cms[v.ConfigMap.Name]
	if !ok {
		return nil, fmt.Errorf("Deployment %s: ConfigMap %s is not installed with it", d.Name, v.ConfigMap.Name)
	}
	text, ok := cm.Data[filepath.Base(file)]
	if !ok {
		return nil, fmt.Errorf("ConfigMap %s has no key %s", cm.Name, filepath.Base(file))
	}
	path := filepath.Join(dir, "walrelay.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		return nil, err
	}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	cs := config.NewSet(fs)
	if err := fs.Parse([]string{"--config", path}); err != nil {
		return nil, err
	}
	// LoadFile validates every key; the secrets' files are not here, so
	// they are checked below instead of read.
	r.cfg = cs.Config()
	if err := cs.LoadFile(path); err != nil {
		return nil, fmt.Errorf("Deployment %s: walrelay refuses ConfigMap %s's configuration: %w", d.Name, cm.Name, err)
	}
	if err := checkPlainPasswords(r.cfg, c); err != nil {
		return nil, fmt.Errorf("Deployment %s, ConfigMap %s: %w", d.Name, cm.Name, err)
	}
	env, err := podEnv(c)
	if err != nil {
		return nil, fmt.Errorf("Deployment %s: %w", d.Name, err)
	}
	for key, p := range map[string]string{
		"postgres.password_file":              r.cfg.Postgres.PasswordFile,
		"kafka.sasl.password_file":            r.cfg.Kafka.SASL.PasswordFile,
		"kafka.schema_registry.password_file": r.cfg.Kafka.SchemaRegistry.PasswordFile,
	} {
		if v, ok := env[config.EnvName(key)]; ok {
			p = v
		}
		if p == "" {
			continue
		}
		v, ok := r.mounts[filepath.Dir(p)]
		if !ok || v.Secret == nil {
			return nil, fmt.Errorf("Deployment %s: %s %s is not in a mounted Secret", d.Name, key, p)
		}
		found := len(v.Secret.Items) == 0
		for _, it := range v.Secret.Items {
			found = found || it.Path == filepath.Base(p)
		}
		if !found {
			return nil, fmt.Errorf("Deployment %s: %s %s: Secret %s has no item of that path", d.Name, key, p, v.Secret.SecretName)
		}
	}
	// The whole configuration validated as run validates it, with the
	// secrets' files put in a directory of the test.
	secrets := filepath.Join(dir, "secrets")
	if err := os.Mkdir(secrets, 0o700); err != nil {
		return nil, err
	}
	full := text
	for mountPath, v := range r.mounts {
		if v.Secret == nil {
			continue
		}
		for _, it := range v.Secret.Items {
			if err := os.WriteFile(filepath.Join(secrets, it.Path), []byte("secret\n"), 0o600); err != nil {
				return nil, err
			}
		}
		full = strings.ReplaceAll(full, mountPath+"/", secrets+"/")
	}
	fullPath := filepath.Join(dir, "walrelay-full.yaml")
	if err := os.WriteFile(fullPath, []byte(full), 0o600); err != nil {
		return nil, err
	}
	// The environment goes in as flags: Load applies them over the file as
	// it would the variables, and this process's environment stays the
	// test's (its tests run in parallel).
	args := []string{"--config", fullPath}
	for _, name := range slices.Sorted(maps.Keys(env)) {
		if key, ok := keyOfVariable(name); ok {
			v := env[name]
			for mountPath, vol := range r.mounts {
				if vol.Secret != nil {
					v = strings.ReplaceAll(v, mountPath+"/", secrets+"/")
				}
			}
			args = append(args, "--"+key+"="+v)
		}
	}
	fs2 := flag.NewFlagSet("run", flag.ContinueOnError)
	cs2 := config.NewSet(fs2)
	if err := fs2.Parse(args); err != nil {
		return nil, err
	}
	cfg, err := cs2.Load(fs2, true)
	if err != nil {
		return nil, fmt.Errorf("Deployment %s: walrelay run would refuse ConfigMap %s's configuration under its environment: %w", d.Name, cm.Name, err)
	}
	r.cfg = cfg
	// What run does next, before it connects: the mapping onto the relay's
	// (or the poll source's) configuration, which checks the brokers'
	// TLS and SASL and the schema registry's keys (config.SinkConfig).
	log := slog.New(slog.DiscardHandler)
	if cfg.Source == "poll" {
		_, err = cfg.PollConfig(log)
	} else {
		_, err = cfg.RelayConfig(log)
	}
	if err != nil {
		return nil, fmt.Errorf("Deployment %s: walrelay run would refuse ConfigMap %s's configuration under its environment: %w", d.Name, cm.Name, err)
	}
	if len(c.Ports) != 1 {
		return nil, fmt.Errorf("Deployment %s: container ports %+v, want the admin port alone", d.Name, c.Ports)
	}
	r.port, r.portName = strconv.Itoa(int(c.Ports[0].ContainerPort)), c.Ports[0].Name
	return r, nil
}

// checkAdmin: the admin listener is reachable from outside the pod, on
// the container's port; the probes ask it for /healthz and
// /readyz?standby=1; the scrape annotations point at its /metrics.
func checkAdmin(r *relay) error {
	host, port, err := net.SplitHostPort(r.cfg.Admin.Listen)
	if err != nil || (host != "0.0.0.0" && host != "" && host != "::") {
		return fmt.Errorf("Deployment %s: admin.listen %q: want all interfaces, else the kubelet cannot probe it", r.d.Name, r.cfg.Admin.Listen)
	}
	if port != r.port {
		return fmt.Errorf("Deployment %s: container port %s, want admin.listen's %s", r.d.Name, r.port, port)
	}
	for name, p := range map[string]*corev1.Probe{"liveness": r.c.LivenessProbe, "readiness": r.c.ReadinessProbe} {
		want := map[string]string{"liveness": "/healthz", "readiness": "/readyz?standby=1"}[name]
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != want || !r.isAdminPort(p.HTTPGet.Port) {
			return fmt.Errorf("Deployment %s: %s probe %+v, want GET %s on the admin port", r.d.Name, name, p, want)
		}
	}
	if a := r.d.Spec.Template.Annotations; a["prometheus.io/port"] != port || a["prometheus.io/path"] != "/metrics" {
		return fmt.Errorf("Deployment %s: scrape annotations %v, want the admin port's /metrics", r.d.Name, a)
	}
	return nil
}

func (r *relay) isAdminPort(p intstr.IntOrString) bool {
	return p.String() == r.portName || p.String() == r.port
}

// checkResources: the memory request covers the measured peak RSS (under
// 64 MiB), and the limit the Go soft limit and 64 MiB more: the binary's
// code (about 27 MiB resident) comes on top of the soft limit, and the
// limit is soft: a large event passes it for a moment
// (TestLargeEventsBoundedMemory).
func checkResources(r *relay) error {
	if m := r.c.Resources.Requests.Memory(); m.IsZero() || m.Value() < 64<<20 {
		return fmt.Errorf("Deployment %s: memory request %v, want at least the 64 MiB walrelay peaks under", r.d.Name, m)
	}
	if lim := r.c.Resources.Limits.Memory(); lim.IsZero() || lim.Value() < r.cfg.SoftMemoryLimit()+64<<20 {
		return fmt.Errorf("Deployment %s: memory limit %v, want at least the Go soft limit %d and 64 MiB for the binary's code and the limit's overshoot", r.d.Name, lim, r.cfg.SoftMemoryLimit())
	}
	return nil
}

// checkStop: shutdown_timeout leaves 5 s of the grace period, so the last
// status update goes out before SIGKILL.
func checkStop(r *relay) error {
	g := r.d.Spec.Template.Spec.TerminationGracePeriodSeconds
	if g == nil {
		return fmt.Errorf("Deployment %s: no terminationGracePeriodSeconds", r.d.Name)
	}
	if grace := time.Duration(*g) * time.Second; r.cfg.ShutdownTimeout+5*time.Second > grace {
		return fmt.Errorf("Deployment %s: shutdown_timeout %s leaves under 5 s of the grace period %s", r.d.Name, r.cfg.ShutdownTimeout, grace)
	}
	return nil
}

// checkSecurity: a non-root pod with a read-only root filesystem, and no
// service account token mounted (walrelay never calls the Kubernetes API).
func checkSecurity(r *relay) error {
	pod := r.d.Spec.Template.Spec
	if r.c.SecurityContext == nil || r.c.SecurityContext.ReadOnlyRootFilesystem == nil || !*r.c.SecurityContext.ReadOnlyRootFilesystem ||
		pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
		return fmt.Errorf("Deployment %s: want a non-root pod with a read-only root filesystem", r.d.Name)
	}
	if a := pod.AutomountServiceAccountToken; a == nil || *a {
		return fmt.Errorf("Deployment %s: automountServiceAccountToken %v, want false: walrelay never calls the Kubernetes API", r.d.Name, a)
	}
	return nil
}

// checkRollout: the Deployment selects its own pods and no other relay's;
// a rolling update keeps a pod of the slot (maxUnavailable under the
// replicas); two or more replicas have one PodDisruptionBudget of
// minAvailable 1 over their pods alone, which evicts an unready pod
// (AlwaysAllow: every replica is unready while Kafka is down, and a drain
// must not wait for Kafka), and one replica has none (a budget of one pod
// blocks every node drain).
func checkRollout(o *objects, r *relay, all []*relay) error {
	d := r.d
	if err := selects("Deployment "+d.Name, d.Spec.Selector.MatchLabels, r); err != nil {
		return err
	}
	for _, other := range all {
		if other != r && matches(d.Spec.Selector.MatchLabels, other.d.Spec.Template.Labels) {
			return fmt.Errorf("Deployment %s selects the pods of Deployment %s", d.Name, other.d.Name)
		}
	}
	replicas := 1
	if d.Spec.Replicas != nil {
		replicas = int(*d.Spec.Replicas)
	}
	if replicas < 1 {
		return fmt.Errorf("Deployment %s: %d replicas", d.Name, replicas)
	}
	if d.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType {
		return fmt.Errorf("Deployment %s: strategy Recreate stops every pod of the slot at an update", d.Name)
	}
	maxUnavailable := intstr.FromString("25%") // Kubernetes' default
	if ru := d.Spec.Strategy.RollingUpdate; ru != nil && ru.MaxUnavailable != nil {
		maxUnavailable = *ru.MaxUnavailable
	}
	unavailable, err := intstr.GetScaledValueFromIntOrPercent(&maxUnavailable, replicas, false)
	if err != nil {
		return fmt.Errorf("Deployment %s: maxUnavailable: %w", d.Name, err)
	}
	if unavailable >= replicas {
		return fmt.Errorf("Deployment %s: maxUnavailable %s of %d replicas: an update stops every pod of the slot", d.Name, maxUnavailable.String(), replicas)
	}
	var budgets []string
	for _, p := range o.pdbs {
		if p.Spec.Selector == nil || !matches(p.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
			continue
		}
		budgets = append(budgets, p.Name)
		if replicas == 1 {
			return fmt.Errorf("PodDisruptionBudget %s covers Deployment %s of one replica: it blocks every node drain", p.Name, d.Name)
		}
		if p.Spec.MinAvailable == nil || p.Spec.MinAvailable.IntValue() != 1 {
			return fmt.Errorf("PodDisruptionBudget %s: minAvailable %v, want 1 (one replica streams or waits)", p.Name, p.Spec.MinAvailable)
		}
		if pol := p.Spec.UnhealthyPodEvictionPolicy; pol == nil || *pol != policyv1.AlwaysAllow {
			return fmt.Errorf("PodDisruptionBudget %s: unhealthyPodEvictionPolicy %v, want AlwaysAllow: readiness fails while Kafka is down, and a drain would wait for it", p.Name, pol)
		}
		for _, other := range all {
			if other != r && matches(p.Spec.Selector.MatchLabels, other.d.Spec.Template.Labels) {
				return fmt.Errorf("PodDisruptionBudget %s selects the pods of Deployments %s and %s: one slot's pod could be all it keeps", p.Name, d.Name, other.d.Name)
			}
		}
	}
	if replicas >= 2 && len(budgets) != 1 {
		return fmt.Errorf("Deployment %s of %d replicas: PodDisruptionBudgets %v, want one", d.Name, replicas, budgets)
	}
	return nil
}

// checkSlots: each relay streams a slot of its own; relays that share a
// database (a sharded outbox) each read a publication of their own with a
// row filter (postgres.allow_row_filter), and no two share a
// transactional id.
func checkSlots(all []*relay) error {
	slots, pubs, ids := map[string]string{}, map[string]string{}, map[string]string{}
	for _, r := range all {
		pg := r.cfg.Postgres
		if other, ok := slots[pg.Slot]; ok {
			return fmt.Errorf("Deployments %s and %s both stream slot %s", other, r.d.Name, pg.Slot)
		}
		slots[pg.Slot] = r.d.Name
		if len(all) == 1 {
			continue
		}
		if !pg.AllowRowFilter {
			return fmt.Errorf("Deployment %s, one shard of %d: postgres.allow_row_filter is off, so its row-filtered publication is refused", r.d.Name, len(all))
		}
		if other, ok := pubs[pg.Publication]; ok {
			return fmt.Errorf("Deployments %s and %s, two shards, read one publication %s: each would publish the other's rows", other, r.d.Name, pg.Publication)
		}
		pubs[pg.Publication] = r.d.Name
		if id := r.cfg.Kafka.TransactionalID; id != "" {
			if other, ok := ids[id]; ok {
				return fmt.Errorf("Deployments %s and %s share kafka.transactional_id %s: walrelay refuses two slots on one id", other, r.d.Name, id)
			}
			ids[id] = r.d.Name
		}
	}
	return nil
}

// checkService: one headless Service publishes every relay's admin port,
// the waiting replicas too.
func checkService(o *objects, all []*relay) error {
	if len(o.svcs) != 1 {
		return fmt.Errorf("%d Services, want one of the admin port", len(o.svcs))
	}
	s := o.svcs[0]
	for _, r := range all {
		if err := selects("Service "+s.Name, s.Spec.Selector, r); err != nil {
			return err
		}
		if len(s.Spec.Ports) != 1 || !r.isAdminPort(s.Spec.Ports[0].TargetPort) || !s.Spec.PublishNotReadyAddresses {
			return fmt.Errorf("Service %s: ports %+v, publishNotReadyAddresses %v: want the admin port, and the waiting replica published too", s.Name, s.Spec.Ports, s.Spec.PublishNotReadyAddresses)
		}
	}
	return nil
}

// checkNetworkPolicy: one NetworkPolicy selects every relay's pods and
// filters their ingress; each rule names its peers (an empty from admits
// everyone) and admits the admin port alone.
func checkNetworkPolicy(o *objects, all []*relay) error {
	if len(o.nps) != 1 {
		return fmt.Errorf("%d NetworkPolicies, want one: the admin port has no authentication", len(o.nps))
	}
	np := o.nps[0]
	for _, r := range all {
		if err := selects("NetworkPolicy "+np.Name, np.Spec.PodSelector.MatchLabels, r); err != nil {
			return err
		}
	}
	ingress := false
	for _, pt := range np.Spec.PolicyTypes {
		ingress = ingress || pt == networkingv1.PolicyTypeIngress
	}
	if !ingress || len(np.Spec.Ingress) == 0 {
		return fmt.Errorf("NetworkPolicy %s: policyTypes %v, ingress %d rules: want Ingress filtered, with a rule for the scraper", np.Name, np.Spec.PolicyTypes, len(np.Spec.Ingress))
	}
	for i, rule := range np.Spec.Ingress {
		if len(rule.From) == 0 {
			return fmt.Errorf("NetworkPolicy %s ingress rule %d has no from: it admits every peer", np.Name, i)
		}
		for _, peer := range rule.From {
			if peer.IPBlock == nil && (peer.PodSelector == nil || len(peer.PodSelector.MatchLabels)+len(peer.PodSelector.MatchExpressions) == 0) &&
				(peer.NamespaceSelector == nil || len(peer.NamespaceSelector.MatchLabels)+len(peer.NamespaceSelector.MatchExpressions) == 0) {
				return fmt.Errorf("NetworkPolicy %s ingress rule %d admits every pod of a namespace or every namespace: %+v", np.Name, i, peer)
			}
		}
		if len(rule.Ports) == 0 {
			return fmt.Errorf("NetworkPolicy %s ingress rule %d admits every port", np.Name, i)
		}
		for _, p := range rule.Ports {
			for _, r := range all {
				if p.Port == nil || !r.isAdminPort(*p.Port) {
					return fmt.Errorf("NetworkPolicy %s ingress rule %d admits port %v, want the admin port %s alone", np.Name, i, p.Port, r.portName)
				}
			}
		}
	}
	return nil
}

// checkMonitors: a PodMonitor selects every relay's pods, a ServiceMonitor
// the admin Service; each scrapes /metrics on the admin port.
func checkMonitors(o *objects, all []*relay) error {
	for _, m := range o.monitors {
		endpoints := m.Spec.PodMetricsEndpoints
		switch m.Kind {
		case "PodMonitor":
			for _, r := range all {
				if err := selects(m.Kind+" "+m.Name, m.Spec.Selector.MatchLabels, r); err != nil {
					return err
				}
			}
		case "ServiceMonitor":
			endpoints = m.Spec.Endpoints
			if len(o.svcs) != 1 || len(m.Spec.Selector.MatchLabels) == 0 || !matches(m.Spec.Selector.MatchLabels, o.svcs[0].Labels) {
				return fmt.Errorf("ServiceMonitor %s selects %v: want the admin Service", m.Name, m.Spec.Selector.MatchLabels)
			}
		}
		if len(endpoints) == 0 {
			return fmt.Errorf("%s %s scrapes nothing", m.Kind, m.Name)
		}
		for _, e := range endpoints {
			port := all[0].portName
			if m.Kind == "ServiceMonitor" {
				port = o.svcs[0].Spec.Ports[0].Name
			}
			if e.Port != port || e.Path != "/metrics" {
				return fmt.Errorf("%s %s scrapes %s on port %q, want /metrics on %q", m.Kind, m.Name, e.Path, e.Port, port)
			}
		}
	}
	return nil
}

// checkInstallation runs every rule on o, and returns its relays.
func checkInstallation(o *objects, dir string) ([]*relay, error) {
	if len(o.deps) == 0 {
		return nil, errors.New("no Deployment")
	}
	var all []*relay
	for i, d := range o.deps {
		sub := filepath.Join(dir, strconv.Itoa(i))
		if err := os.Mkdir(sub, 0o700); err != nil {
			return nil, err
		}
		r, err := loadRelay(o, d, sub)
		if err != nil {
			return nil, err
		}
		all = append(all, r)
	}
	for _, r := range all {
		for _, check := range []func(*relay) error{checkAdmin, checkResources, checkStop, checkSecurity} {
			if err := check(r); err != nil {
				return nil, err
			}
		}
		if err := checkRollout(o, r, all); err != nil {
			return nil, err
		}
	}
	if err := checkSlots(all); err != nil {
		return nil, err
	}
	if err := checkService(o, all); err != nil {
		return nil, err
	}
	if err := checkNetworkPolicy(o, all); err != nil {
		return nil, err
	}
	if err := checkMonitors(o, all); err != nil {
		return nil, err
	}
	return all, nil
}

// selects reports what the selector sel of what lacks to select r's pods.
func selects(what string, sel map[string]string, r *relay) error {
	if len(sel) == 0 {
		return fmt.Errorf("%s selects nothing", what)
	}
	labels := r.d.Spec.Template.Labels
	for k, v := range sel {
		if labels[k] != v {
			return fmt.Errorf("%s selects %s=%s, which the pods of Deployment %s lack", what, k, v, r.d.Name)
		}
	}
	return nil
}

// matches reports whether a non-empty selector sel selects labels.
func matches(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// keyOfVariable returns the walrelay key whose variable is name.
func keyOfVariable(name string) (key string, ok bool) {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	config.NewSet(fs)
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name != "config" && config.EnvName(f.Name) == name {
			key, ok = f.Name, true
		}
	})
	return key, ok
}

// checkPlainPasswords: no password in the ConfigMap's file (fileCfg,
// as the file alone sets it) nor written into the container's env: a
// ConfigMap is not a Secret, and the Deployment's env is read by whoever
// may read the Deployment. A DSN written into env is refused whole (it
// is where a password goes); give it from a Secret (valueFrom).
func checkPlainPasswords(fileCfg *config.Config, c corev1.Container) error {
	for key, pw := range map[string]string{
		"kafka.sasl.password":            fileCfg.Kafka.SASL.Password,
		"kafka.schema_registry.password": fileCfg.Kafka.SchemaRegistry.Password,
	} {
		if pw != "" {
			return fmt.Errorf("%s in plain text: give it from a Secret (%s_file, existingSecret)", key, key)
		}
	}
	if dsnHoldsPassword(fileCfg.Postgres.DSN) {
		return errors.New("postgres.dsn holds a password: give it from a Secret (postgres.password_file, existingSecret)")
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil && e.Value != "" && (strings.HasSuffix(e.Name, "_PASSWORD") || strings.HasSuffix(e.Name, "_DSN")) {
			return fmt.Errorf("env %s holds its value in plain text: give it from a Secret (valueFrom.secretKeyRef)", e.Name)
		}
	}
	return nil
}

// dsnHoldsPassword reports whether dsn, a URL or key=value keywords,
// writes a password: postgres://user:pw@, ?password=, or password=. It
// reads the text alone (pgconn's parse would take PGPASSWORD and the
// passfile of this process).
func dsnHoldsPassword(dsn string) bool {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		rest := dsn[strings.Index(dsn, "://")+3:]
		if at := strings.LastIndex(strings.SplitN(rest, "/", 2)[0], "@"); at >= 0 && strings.Contains(rest[:at], ":") {
			return true
		}
		if _, query, ok := strings.Cut(rest, "?"); ok {
			for kv := range strings.SplitSeq(query, "&") {
				if k, _, _ := strings.Cut(kv, "="); k == "password" {
					return true
				}
			}
		}
		return false
	}
	for _, kv := range strings.Fields(dsn) {
		if k, _, _ := strings.Cut(kv, "="); k == "password" {
			return true
		}
	}
	return false
}

// dockerfile is the image's build, whose ENV the container starts with.
const dockerfile = "../../Dockerfile"

// imageEnv returns the variables that the Dockerfile's last stage (the
// image) sets with ENV: a stage's ENV is its own, so each FROM starts
// afresh. It reads ENV K=V ... and ENV K V, and refuses what it does not
// read (quotes, a continued line) rather than guess.
func imageEnv() (map[string]string, error) {
	b, err := os.ReadFile(dockerfile)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "FROM":
			env = map[string]string{}
		case "ENV":
			if len(f) < 2 || strings.ContainsAny(line, `"'\\`) {
				return nil, fmt.Errorf("%s: %q: an ENV this test does not read", dockerfile, strings.TrimSpace(line))
			}
			if !strings.Contains(f[1], "=") {
				env[f[1]] = strings.Join(f[2:], " ")
				continue
			}
			for _, kv := range f[1:] {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return nil, fmt.Errorf("%s: %q: an ENV this test does not read", dockerfile, strings.TrimSpace(line))
				}
				env[k] = v
			}
		}
	}
	return env, nil
}

// podEnv returns the environment walrelay starts with in container c: the
// image's ENV, each overridden by the container's variable of that name,
// as Kubernetes does. A variable from a Secret (valueFrom) has a value the
// render does not hold: a password stands in as "secret"; any other is
// left out, and the file's value stands (the image's is overridden
// either way). envFrom is refused: its variables cannot be seen here.
func podEnv(c corev1.Container) (map[string]string, error) {
	if len(c.EnvFrom) > 0 {
		return nil, errors.New("envFrom: its variables are not in the render; list each in env")
	}
	env, err := imageEnv()
	if err != nil {
		return nil, err
	}
	for _, e := range c.Env {
		if _, ok := keyOfVariable(e.Name); strings.HasPrefix(e.Name, "WALRELAY_") && !ok {
			return nil, fmt.Errorf("env %s names no walrelay key", e.Name)
		}
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case strings.HasSuffix(e.Name, "_PASSWORD"):
			env[e.Name] = "secret"
		default:
			delete(env, e.Name)
		}
	}
	return env, nil
}
