// Package sqlquote writes a value into SQL text as a string literal, for
// the few statements that take no bind parameter (COMMENT, SET TRANSACTION
// SNAPSHOT, a function's body, a DO block, a query on a replication
// connection). The literal reads the same whether the session has
// standard_conforming_strings on or off, as libpq's PQescapeLiteral's does.
package sqlquote
