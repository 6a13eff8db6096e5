// Package oauth makes physd an OAuth 2.1 resource server: it discovers an
// authorization server's metadata (RFC 8414, OpenID Connect discovery),
// keeps its JWKS (refreshed on an unknown key id, rate-limited, every
// fetch deadline-bounded, the cached keys kept while the AS is down),
// checks access tokens (RFC 9068 JWTs, or RFC 7662 introspection for
// opaque ones) against the policy's identity.oauth, and returns the
// caller as a policy.Principal.
package oauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// FetchTimeout bounds every request physd makes to an authorization
// server: a slow AS delays a caller by at most this, never indefinitely.
const FetchTimeout = 5 * time.Second

// maxDocument bounds a metadata, JWKS or introspection answer.
const maxDocument = 1 << 20

// errNotFound is a 404 (or 410) answer: try the next discovery location.
var errNotFound = errors.New("not found")

// getJSON fetches url into v within FetchTimeout.
func getJSON(ctx context.Context, c *http.Client, url string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, FetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	return doJSON(c, req, v)
}

// doJSON sends req and decodes a 200 answer's JSON body into v.
func doJSON(c *http.Client, req *http.Request, v any) error {
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		return fmt.Errorf("%s: %s: %w", req.URL, resp.Status, errNotFound)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("%s: %s", req.URL, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxDocument+1))
	if err != nil {
		return fmt.Errorf("%s: %w", req.URL, err)
	}
	if len(body) > maxDocument {
		return fmt.Errorf("%s: answer larger than %d bytes", req.URL, maxDocument)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("%s: %w", req.URL, err)
	}
	return nil
}

// discoveryURLs are where an issuer's metadata may be, in order: RFC 8414
// §3.1 inserts the well-known path before the issuer's path; OpenID
// Connect discovery appends it.
func discoveryURLs(issuer string) []string {
	scheme, rest, _ := strings.Cut(issuer, "://")
	host, path, _ := strings.Cut(rest, "/")
	path = strings.TrimSuffix("/"+path, "/")
	return []string{
		scheme + "://" + host + "/.well-known/oauth-authorization-server" + path,
		strings.TrimSuffix(issuer, "/") + "/.well-known/openid-configuration",
	}
}
