package migrations

// UncheckedFunctionBodies turns the server's check of the bodies the
// migrations create off until restore is called: the quoting alone is
// then what keeps a name from ending a body. Not for parallel tests.
func UncheckedFunctionBodies() (restore func()) {
	checkFunctionBodies = "off"
	return func() { checkFunctionBodies = "on" }
}
