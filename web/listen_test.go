package web_test

import (
	"strings"
	"testing"

	"github.com/physd/physd/web"
)

func TestCheckListen(t *testing.T) {
	const tok = "a-token-of-enough-length"
	for _, c := range []struct {
		e    web.Exposure
		want string // "" accepted
	}{
		{web.Exposure{Addr: "127.0.0.1:8080"}, ""},
		{web.Exposure{Addr: "[::1]:8080"}, ""},
		{web.Exposure{Addr: "0.0.0.0:8080"}, "not a loopback address"},
		{web.Exposure{Addr: ":8080", AllowRemote: true}, "auth token of at least 16 characters"},
		{web.Exposure{Addr: ":8080", AllowRemote: true, Token: "short"}, "auth token of at least 16 characters"},
		{web.Exposure{Addr: ":8080", AllowRemote: true, Token: tok}, "--tls-cert FILE --tls-key FILE, or pass --insecure-plain-http"},
		{web.Exposure{Addr: ":8080", AllowRemote: true, Token: tok, TLS: true}, ""},
		{web.Exposure{Addr: ":8080", AllowRemote: true, Token: tok, PlainHTTP: true}, ""},
		{web.Exposure{Addr: ":8080", AllowRemote: true, ClientCerts: true, TLS: true}, ""},
	} {
		err := web.CheckListen(c.e)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v refused: %v", c.e, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: %v; want an error saying %q", c.e, err, c.want)
		}
	}
}
