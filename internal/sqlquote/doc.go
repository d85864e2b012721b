// Package sqlquote owns how walrelay writes text into SQL where a bind
// parameter cannot go: a value as a string literal (COMMENT, SET
// TRANSACTION SNAPSHOT, a query on a replication connection), a
// function's or DO block's body under a dollar tag the body cannot hold
// (Dollar), and the rules a name must keep before it is quoted into a
// statement (CheckName). The literal reads the same whether the session
// has standard_conforming_strings on or off, as libpq's PQescapeLiteral's
// does.
package sqlquote
