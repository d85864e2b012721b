package registry

import (
	"errors"
	"strings"
	"testing"
)

// TestCheckRegistryURLRefusesQueryOrFragment: a token in the registry
// URL's query (?access_token=...) or fragment passed CheckURL,
// franz-go kept the query on every request, and its errors printed the URL
// whole: `unable to GET "http://127.0.0.1:1/subjects?access_token=..."`
// (review44's TestProbe44RegistryURLTokenInQuery). A query or fragment,
// even an empty one, is refused (ErrURLQuery) without printing
// it; a path, which a token in it cannot be told from, passes.
func TestCheckRegistryURLRefusesQueryOrFragment(t *testing.T) {
	for _, u := range []string{
		"http://127.0.0.1:1/?access_token=s3cret-pw",
		"http://127.0.0.1:1?access_token=s3cret-pw",
		"https://registry/apis/ccompat/v7?token=s3cret-pw",
		"http://registry:8081/#s3cret-pw",
		"http://registry:8081#access_token=s3cret-pw",
		"http://registry:8081/?",
		"http://registry:8081/#",
	} {
		if err := CheckURL(u); !errors.Is(err, ErrURLQuery) {
			t.Errorf("CheckURL(%q): %v, want ErrURLQuery", u, err)
		}
		reg, err := New(Config{URL: u})
		if err == nil {
			err = reg.Ping(t.Context())
			t.Errorf("New(%q) taken (a ping: %v), want a refusal", u, err)
			continue
		}
		if !errors.Is(err, ErrURLQuery) || strings.Contains(err.Error(), "s3cret-pw") {
			t.Errorf("New(%q): %v, want ErrURLQuery, not printing the URL", u, err)
		}
	}
	for _, u := range []string{"http://registry:8081/t/s3cret-pw/", "http://registry:8081/apis/ccompat/v7/"} {
		if err := CheckURL(u); err != nil {
			t.Errorf("CheckURL(%q): %v, want a path taken", u, err)
		}
	}
}

// TestCheckRegistryURL: a registry URL is http or https with a host and
// no credentials; New refuses any other without printing it (a
// host:port with credentials and no scheme parses as the scheme "user",
// which franz-go took and printed, password and all).
func TestCheckRegistryURL(t *testing.T) {
	for _, c := range []struct {
		url  string
		want error
	}{
		{"http://registry:8081", nil},
		{"https://registry/apis/ccompat/v7", nil},
		{"http://[::1]:8081", nil},
		{"user:s3cret-pw@127.0.0.1:1", ErrURL},
		{"http:/user:s3cret-pw@127.0.0.1:1", ErrURL},
		{"http:user:s3cret-pw@127.0.0.1:1", ErrURL},
		{"registry:8081", ErrURL},
		{"ftp://registry", ErrURL},
		{"http://", ErrURL},
		{"http://u:s3cret-pw@registry:8081/%zz", ErrURL},
		{"http://u:s3cret-pw@registry:8081", ErrURLCredentials},
		{"https://s3cret-pw@registry", ErrURLCredentials},
		{"//s3cret-pw@registry", ErrURLCredentials},
	} {
		err := CheckURL(c.url)
		if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("CheckURL(%q): %v, want %v", c.url, err, c.want)
		}
		if c.want == nil {
			continue
		}
		if _, err := New(Config{URL: c.url}); err == nil || strings.Contains(err.Error(), "s3cret-pw") {
			t.Errorf("New(%q): %v, want a refusal that does not print the URL", c.url, err)
		}
	}
}
