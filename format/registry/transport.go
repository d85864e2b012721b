package registry

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sync/atomic"

	"github.com/walrelay/walrelay/internal/noredirect"
)

// observed is a registry's HTTP transport that reports the outcome of each
// request to the function set with Client.OnRequest, and bounds the size
// of the answers (max bytes).
type observed struct {
	base http.RoundTripper
	max  int64
	f    atomic.Pointer[func(error)]
}

// maxErrorPeek bounds what RoundTrip reads of a 404 to find Confluent's
// error code in it.
const maxErrorPeek = 64 << 10

// RoundTrip implements http.RoundTripper: a redirect, which base refuses
// (a URL that does not serve the API itself, ErrNotSchemaRegistry:
// redirected), a request that gets no answer, a 5xx, a 408, 425 or 429
// (asked to retry later: retryLater), a 404 without Confluent's error
// code (a path that is not the API, ErrNotSchemaRegistry), an HTML page,
// or an answer larger than max is a
// failure of the registry (an outage, or a configuration problem held as
// one); any other answer, a 4xx included, is the registry answering.
func (o *observed) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := o.base.RoundTrip(req)
	var fail error
	var refused *noredirect.Error
	switch {
	case errors.As(err, &refused):
		err = &redirected{refused}
		fail = err
	case err != nil:
		fail = fmt.Errorf("no answer: %w", err)
	case resp.StatusCode >= 500:
		fail = fmt.Errorf("no answer: HTTP %d from %s", resp.StatusCode, req.URL.Redacted())
	case retryLater(resp.StatusCode):
		fail = fmt.Errorf("no answer: HTTP %d from %s (retry later)", resp.StatusCode, req.URL.Redacted())
	case o.max > 0 && resp.ContentLength > o.max:
		resp.Body.Close()
		resp, err = nil, o.tooLarge(req)
		fail = err
	case resp.StatusCode == http.StatusNotFound:
		var code int
		code, resp.Body = errorCode(resp.Body)
		if code < 40401 || code > 40403 {
			fail = fmt.Errorf("%w: HTTP 404 from %s without Confluent's error code (40401, 40402 or 40403)", ErrNotSchemaRegistry, req.URL.Redacted())
		}
	case resp.StatusCode < 300 && html(resp.Header.Get("Content-Type")):
		fail = fmt.Errorf("%w: an HTML page (HTTP %d) from %s", ErrNotSchemaRegistry, resp.StatusCode, req.URL.Redacted())
	}
	if resp != nil && o.max > 0 {
		resp.Body = &limited{r: resp.Body, left: o.max, over: func() error {
			err := o.tooLarge(req)
			o.report(err)
			return err
		}}
	}
	o.report(fail)
	return resp, err
}

// redirected is a registry's answer with a redirect, which walrelay does
// not follow (base refuses it): its URL does not serve the API itself, so
// it is ErrNotSchemaRegistry, a configuration problem held as an outage.
type redirected struct{ err *noredirect.Error }

func (r *redirected) Error() string {
	return r.err.Error() + ": give the registry's URL that answers itself"
}
func (r *redirected) Unwrap() error        { return r.err }
func (r *redirected) Is(target error) bool { return target == ErrNotSchemaRegistry }

// registryError is err, of the registry's client, cut to MaxErrorText; a
// refused redirect alone (franz-go and net/http quote the request's URL
// before it, which it names itself).
func registryError(err error) error {
	var r *redirected
	if errors.As(err, &r) {
		return bounded{r}
	}
	return bounded{err}
}

// tooLarge is the error of an answer larger than max.
func (o *observed) tooLarge(req *http.Request) error {
	return fmt.Errorf("the schema registry's answer to %s is larger than %d MiB: not read (a registry or a proxy in front of it answering something else than Confluent's API?)", req.URL.Redacted(), o.max>>20)
}

// report calls the function of OnRequest, if any, with err.
func (o *observed) report(err error) {
	if f := o.f.Load(); f != nil {
		(*f)(err)
	}
}

// errorCode reads Confluent's error_code from the start of an error's
// body, and returns a body that reads the whole of it again.
func errorCode(body io.ReadCloser) (int, io.ReadCloser) {
	peek, err := io.ReadAll(io.LimitReader(body, maxErrorPeek))
	rest := io.MultiReader(bytes.NewReader(peek), body)
	if err != nil {
		rest = io.MultiReader(bytes.NewReader(peek), errReader{err})
	}
	var e struct {
		ErrorCode int `json:"error_code"`
	}
	_ = json.Unmarshal(peek, &e) // not JSON: no code
	return e.ErrorCode, readCloser{rest, body}
}

// html reports whether a Content-Type is an HTML page's: a web server's
// or a proxy's page, never Confluent's API.
func html(ct string) bool {
	mt, _, _ := mime.ParseMediaType(ct)
	return mt == "text/html"
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

type readCloser struct {
	io.Reader
	io.Closer
}

// limited reads at most left bytes of r, then fails with over's error.
type limited struct {
	r    io.ReadCloser
	left int64
	over func() error
	err  error
}

func (l *limited) Read(p []byte) (int, error) {
	if l.err != nil {
		return 0, l.err
	}
	if l.left <= 0 {
		// One byte more tells a body of exactly the limit from a larger one.
		var one [1]byte
		if n, err := l.r.Read(one[:]); n == 0 {
			return 0, err
		}
		l.err = l.over()
		return 0, l.err
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

func (l *limited) Close() error { return l.r.Close() }

// OnRequest has f called after each request to the registry: with nil if
// it answered (a 4xx included), with the error if it did not answer,
// answered 5xx or asked to retry later (408, 425, 429), answered as
// something else than Confluent's API or with a redirect, which walrelay
// does not follow (errors.Is ErrNotSchemaRegistry: a configuration
// problem), or answered more than the answers' bound. For metrics and
// status; f must be fast and safe for concurrent use. Passwords are in no
// error (basic auth is a header).
func (r *Client) OnRequest(f func(err error)) {
	if r.obs != nil {
		r.obs.f.Store(&f)
	}
}

// NotSchemaRegistry reports whether err, as OnRequest gives it, is a
// configuration problem (a URL that does not serve Confluent's API)
// rather than a registry that does not answer.
func NotSchemaRegistry(err error) bool { return errors.Is(err, ErrNotSchemaRegistry) }
