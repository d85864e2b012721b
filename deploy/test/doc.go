// Package test checks walrelay's deployment files against walrelay itself:
// the Kubernetes manifests, and the Helm chart rendered with each of its
// variants through Helm's Go library, parsed strictly into the API's
// types and held to one set of rules (checkInstallation): probes, ports,
// configuration (under the Dockerfile's ENV and the pod's env, as
// Kubernetes sets them) and secrets against what walrelay serves and reads,
// resources, the stop, the rollout and the budget, shards, the Service,
// the NetworkPolicy and the monitors. It also evaluates the Prometheus
// alert rules. It is a module of its own so that the Kubernetes API's and
// Helm's packages stay out of walrelay's dependencies; .ci/run runs it.
package test
