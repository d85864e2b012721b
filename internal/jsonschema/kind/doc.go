// Package kind is github.com/santhosh-tekuri/jsonschema/v6/kind v6.0.3,
// unchanged: the kinds of validation errors of package jsonschema (its
// copy in walrelay; see ../WALRELAY.md).
package kind
