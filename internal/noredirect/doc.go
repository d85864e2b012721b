// Package noredirect is the one place where walrelay's HTTP clients refuse
// redirects: the schema registry's client, the OTLP/HTTP trace exporter,
// and `walrelay status`'s client of the admin listener all use it.
//
// A client that follows a redirect sends its request, and with it
// credentials, where the server it was configured for points: Go's client
// keeps the Authorization header on a redirect to another port or from
// https to http on the same host, and every other header (an OTLP
// x-api-key) on a redirect to any host. And the answer of the server
// redirected to would be taken as the configured server's. walrelay
// follows none: an answer with a redirect status (301, 302, 303, 307,
// 308) is an *Error that names the URL that answered and where it
// pointed, without userinfo, query or fragment (where a token would be),
// and without the redirect's body.
//
// Client is the client to build, or to hand to a library that takes one
// (the registry's franz-go client, the OTLP exporter); Transport is the
// refusal alone, for a RoundTripper layered over it. A library's own
// client cannot be made to refuse from outside: an http.Transport's Proxy
// function sees the request that follows a redirect only when it needs a
// new connection, and over HTTP/2 a redirect to the same host and port
// goes on the connection already open.
package noredirect
