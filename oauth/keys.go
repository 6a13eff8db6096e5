package oauth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/time/rate"
)

// Key-cache timing. A JWKS older than maxKeyAge is refetched on the next
// token (keys are rotated in, and old ones out, over hours); a failed
// fetch is not retried for retryAfter (an AS that is down is not hammered
// by every request); an unknown kid refetches at most refreshBurst times
// at once and then once per refreshEvery (a caller that sends made-up key
// ids cannot make physd flood the AS).
const (
	maxKeyAge    = time.Hour
	retryAfter   = 10 * time.Second
	refreshEvery = time.Minute
	refreshBurst = 3
)

// authServer is one authorization server's discovered metadata and keys.
// It outlives a policy reload (Pool), so a reload while the AS is down
// keeps the keys.
type authServer struct {
	issuer      string
	metadataURL string // "" discovers
	client      *http.Client

	// fetch serializes fetches: concurrent callers that miss wait for the
	// one fetch in flight (bounded by FetchTimeout), then look again.
	fetch sync.Mutex

	mu       sync.Mutex
	meta     *oauthex.AuthServerMeta
	keys     *jose.JSONWebKeySet
	gen      uint64    // bumped by every successful key fetch
	fetched  time.Time // last successful key fetch
	failed   time.Time // last failed fetch
	lastErr  error
	unknown  *rate.Limiter // refreshes caused by an unknown kid
	fetchNum int           // fetch attempts, for tests and the log
}

func newAuthServer(issuer, metadataURL string, c *http.Client) *authServer {
	return &authServer{issuer: issuer, metadataURL: metadataURL, client: c,
		unknown: rate.NewLimiter(rate.Every(refreshEvery), refreshBurst)}
}

// errUnknownKey is a kid the AS's JWKS does not have (after a refresh,
// or when none was allowed).
var errUnknownKey = errors.New("unknown key id")

// candidates returns the cached keys that may have signed a token with
// kid and alg, refreshing the JWKS when none does and a refresh is
// allowed. It never returns a key it did not get from the AS: a fetch
// failure with nothing cached is an error.
func (a *authServer) candidates(ctx context.Context, kid string, alg string) ([]jose.JSONWebKey, error) {
	keys, gen, stale := a.cached(kid, alg)
	if len(keys) > 0 && !stale {
		return keys, nil
	}
	// Stale keys (older than maxKeyAge) and a first use are refreshed
	// without spending the unknown-kid budget; an unknown kid spends it.
	if len(keys) == 0 && gen > 0 && !a.unknown.Allow() {
		return nil, fmt.Errorf("%w %q (JWKS refreshes for unknown key ids are rate-limited: at most %d, then one per %s)", errUnknownKey, kid, refreshBurst, refreshEvery)
	}
	// A failed refresh keeps what is cached: stale keys still verify while
	// the AS is down.
	if err := a.refresh(ctx, gen); err != nil && len(keys) == 0 {
		if gen == 0 {
			return nil, fmt.Errorf("no keys of %s: %w", a.issuer, err)
		}
		return nil, fmt.Errorf("%w %q (and the JWKS refresh failed: %v)", errUnknownKey, kid, err)
	}
	keys, _, _ = a.cached(kid, alg)
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w %q: not in the JWKS of %s", errUnknownKey, kid, a.issuer)
	}
	return keys, nil
}

// cached returns the cached keys that match kid (any when kid is empty)
// and alg, the cache's generation (0: never fetched) and whether it is due
// for a refresh.
func (a *authServer) cached(kid, alg string) ([]jose.JSONWebKey, uint64, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.keys == nil {
		return nil, a.gen, a.retryDue()
	}
	var out []jose.JSONWebKey
	for _, k := range a.keys.Keys {
		if (kid == "" || k.KeyID == kid) && (k.Algorithm == "" || k.Algorithm == alg) && (k.Use == "" || k.Use == "sig") && k.IsPublic() {
			out = append(out, k)
		}
	}
	stale := time.Since(a.fetched) > maxKeyAge && a.retryDue()
	return out, a.gen, stale
}

// retryDue reports whether a fetch may be tried now (not within
// retryAfter of a failure). a.mu is held.
func (a *authServer) retryDue() bool {
	return a.failed.IsZero() || time.Since(a.failed) >= retryAfter
}

// refresh fetches the metadata (once) and the JWKS, unless another
// caller's fetch completed since gen was read.
func (a *authServer) refresh(ctx context.Context, gen uint64) error {
	a.fetch.Lock()
	defer a.fetch.Unlock()
	a.mu.Lock()
	if a.gen != gen {
		a.mu.Unlock()
		return nil // someone else fetched while this caller waited
	}
	if !a.retryDue() && a.lastErr != nil {
		err := a.lastErr
		a.mu.Unlock()
		return fmt.Errorf("last fetch failed %s ago: %w", time.Since(a.failed).Round(time.Second), err)
	}
	meta := a.meta
	a.fetchNum++
	a.mu.Unlock()

	keys, meta, err := a.fetchKeys(ctx, meta)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		a.failed, a.lastErr = time.Now(), err
		return err
	}
	a.meta, a.keys, a.fetched, a.failed, a.lastErr = meta, keys, time.Now(), time.Time{}, nil
	a.gen++
	return nil
}

// fetchKeys discovers the metadata when meta is nil, then fetches the
// JWKS it names.
func (a *authServer) fetchKeys(ctx context.Context, meta *oauthex.AuthServerMeta) (*jose.JSONWebKeySet, *oauthex.AuthServerMeta, error) {
	if meta == nil {
		m, err := a.discover(ctx)
		if err != nil {
			return nil, nil, err
		}
		meta = m
	}
	if meta.JWKSURI == "" {
		return nil, meta, fmt.Errorf("the metadata of %s has no jwks_uri", a.issuer)
	}
	var set jose.JSONWebKeySet
	if err := getJSON(ctx, a.client, meta.JWKSURI, &set); err != nil {
		return nil, meta, fmt.Errorf("JWKS: %w", err)
	}
	return &set, meta, nil
}

// discover reads the AS metadata from metadata_url, else RFC 8414, else
// OpenID Connect discovery. Its issuer must be the configured one
// (RFC 8414 §3.3): a document that names another issuer is not this AS's.
func (a *authServer) discover(ctx context.Context) (*oauthex.AuthServerMeta, error) {
	urls := discoveryURLs(a.issuer)
	if a.metadataURL != "" {
		urls = []string{a.metadataURL}
	}
	var errs []error
	for _, u := range urls {
		var m oauthex.AuthServerMeta
		err := getJSON(ctx, a.client, u, &m)
		if err == nil && m.Issuer != a.issuer {
			err = fmt.Errorf("%s names issuer %q, not %q", u, m.Issuer, a.issuer)
		}
		if err == nil {
			return &m, nil
		}
		errs = append(errs, err)
		if !errors.Is(err, errNotFound) {
			break // a failure other than "not here" is not a reason to look elsewhere
		}
	}
	return nil, fmt.Errorf("metadata of %s: %w", a.issuer, errors.Join(errs...))
}

// introspectionEndpoint is the metadata's introspection_endpoint,
// discovering the metadata when it is not cached.
func (a *authServer) introspectionEndpoint(ctx context.Context) (string, error) {
	a.mu.Lock()
	meta := a.meta
	a.mu.Unlock()
	if meta == nil {
		m, err := a.discover(ctx)
		if err != nil {
			return "", err
		}
		a.mu.Lock()
		if a.meta == nil {
			a.meta = m
		}
		a.mu.Unlock()
		meta = m
	}
	if meta.IntrospectionEndpoint == "" {
		return "", fmt.Errorf("the metadata of %s has no introspection_endpoint", a.issuer)
	}
	return meta.IntrospectionEndpoint, nil
}
