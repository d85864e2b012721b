// Package test checks walrelay's deployment files against walrelay itself:
// the Kubernetes manifests parsed strictly into the API's types, their
// probes, ports, configuration and secrets against what walrelay serves and
// reads. It is a module of its own so that the Kubernetes API's packages
// stay out of walrelay's dependencies; .ci/run runs it.
package test
