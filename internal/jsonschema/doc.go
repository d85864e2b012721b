// Package jsonschema is github.com/santhosh-tekuri/jsonschema/v6 v6.0.3
// (Apache License 2.0, see LICENSE), copied with one change: the five
// drafts' metaschemas are compiled when the first Compiler is made
// (NewCompiler), not in the package's init. Upstream's init does that work
// in every program that links the package: about 1.7 MB of allocations and
// several milliseconds at the start of every walrelay process, which
// compiles a JSON Schema only for a registered_jsonschema subject (package
// format). WALRELAY.md says what was copied and how to update it.
package jsonschema
