package noredirect

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Error is an answer with a redirect, which walrelay does not follow.
type Error struct {
	// URL is the URL that answered with the redirect, without userinfo,
	// query or fragment.
	URL string
	// Status is the answer's HTTP status: 301, 302, 303, 307 or 308.
	Status int
	// Location is where the answer redirects to, resolved against URL,
	// without userinfo, query or fragment; "" if the answer has none, or
	// one that does not parse.
	Location string
}

func (e *Error) Error() string {
	loc := "no Location"
	if e.Location != "" {
		loc = "a redirect to " + e.Location
	}
	return fmt.Sprintf("%s answered HTTP %d (%s), which walrelay does not follow", e.URL, e.Status, loc)
}

// Redirect reports whether status is one that Go's client follows.
func Redirect(status int) bool {
	switch status {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		return true
	}
	return false
}

// errorOf is the *Error of resp, an answer with a redirect to the request
// of URL u.
func errorOf(u *url.URL, resp *http.Response) *Error {
	e := &Error{URL: "the configured URL", Status: resp.StatusCode}
	if u != nil {
		e.URL = printable(u)
	}
	if raw := resp.Header.Get("Location"); raw != "" {
		if loc, err := url.Parse(raw); err == nil {
			if u != nil {
				loc = u.ResolveReference(loc)
			}
			e.Location = printable(loc)
		}
	}
	return e
}

// maxPrinted bounds a URL in an Error: a Location is the server's to
// choose, and errors go into logs and dead letters.
const maxPrinted = 256

// printable is u without userinfo, query or fragment (what may hold a
// secret), cut to maxPrinted bytes.
func printable(u *url.URL) string {
	c := *u
	c.User, c.RawQuery, c.ForceQuery, c.Fragment, c.RawFragment = nil, "", false, "", ""
	s := c.String() // escaped: ASCII
	if len(s) > maxPrinted {
		s = s[:maxPrinted] + "…"
	}
	return s
}

// Transport returns base (http.DefaultTransport if nil) refusing
// redirects: an answer with a redirect status is closed unread and
// RoundTrip returns an *Error instead. (A RoundTripper should return the
// answers it gets; this one is only ever given to a Client that would
// follow them otherwise.)
func Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return transport{base}
}

type transport struct{ base http.RoundTripper }

func (t transport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil || !Redirect(resp.StatusCode) {
		return resp, err
	}
	// The body is the redirect's, not an answer of the configured URL:
	// never read, never quoted.
	resp.Body.Close()
	return nil, errorOf(req.URL, resp)
}

// errFollowed is CheckRedirect's error, which Transport keeps from being
// reached.
var errFollowed = errors.New("walrelay follows no redirect")

// Client returns an HTTP client that refuses redirects (Transport(base))
// and bounds each request to timeout (0: no bound).
func Client(base http.RoundTripper, timeout time.Duration) *http.Client {
	return &http.Client{
		Transport: Transport(base),
		Timeout:   timeout,
		// Never called (Transport returns no redirect), but should the
		// transport be swapped, still nothing is followed.
		CheckRedirect: func(*http.Request, []*http.Request) error { return errFollowed },
	}
}
