package oauth

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"

	josejwt "github.com/go-jose/go-jose/v4/jwt"

	"github.com/physd/physd/policy"
)

// introspection is an RFC 7662 §2.2 answer.
type introspection struct {
	Active    bool                 `json:"active"`
	Scope     string               `json:"scope"`
	ClientID  string               `json:"client_id"`
	Subject   string               `json:"sub"`
	Audience  josejwt.Audience     `json:"aud"`
	Issuer    string               `json:"iss"`
	Expiry    *josejwt.NumericDate `json:"exp"`
	NotBefore *josejwt.NumericDate `json:"nbf"`
}

// introspect asks each authorization server that introspects about an
// opaque token; the first that calls it active decides. An AS that cannot
// be reached accepts nothing.
func (v *Verifier) introspect(ctx context.Context, token string, audiences []string) (policy.Principal, error) {
	var errs []error
	for iss, cred := range v.intro {
		r, err := v.introspectAt(ctx, v.servers[iss], cred, token)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !r.Active {
			continue
		}
		// An answer that names another issuer is not this AS's to give.
		if r.Issuer != "" && r.Issuer != iss {
			errs = append(errs, errors.New("introspection at "+iss+" named issuer "+r.Issuer))
			continue
		}
		return v.check(iss, r.Subject, r.Audience, r.Expiry, r.NotBefore, strings.Fields(r.Scope), audiences)
	}
	if len(errs) > 0 {
		return policy.Principal{}, refuse("the access token cannot be checked now", "introspection: %v", errors.Join(errs...))
	}
	return policy.Principal{}, refuse("the access token is not active", "no authorization server knows it as an active token")
}

func (v *Verifier) introspectAt(ctx context.Context, as *authServer, cred *policy.Introspection, token string) (*introspection, error) {
	ctx, cancel := context.WithTimeout(ctx, FetchTimeout)
	defer cancel()
	endpoint, err := as.introspectionEndpoint(ctx)
	if err != nil {
		return nil, err
	}
	form := url.Values{"token": {token}, "token_type_hint": {"access_token"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	req.SetBasicAuth(url.QueryEscape(cred.ClientID), url.QueryEscape(cred.ClientSecret)) // RFC 6749 §2.3.1
	var r introspection
	if err := doJSON(v.client, req, &r); err != nil {
		return nil, err
	}
	return &r, nil
}
