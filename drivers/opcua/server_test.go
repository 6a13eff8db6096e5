package opcua

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/drivers/opcua/opcuatest"
)

// The tests below run against node-opcua (examples/opcua/server), an OPC UA
// server implementation independent of gopcua; they skip when it is not
// installed.

func plant(t *testing.T, endpoint, extra string) (*Bus, map[string]drivers.Point) {
	t.Helper()
	bus := "{type: opcua, endpoint: '" + endpoint + "', connect_timeout_ms: 10000, reconnect_backoff_ms: 200" + extra + "}"
	caps := readCap("temperature", "float", "{type: opcua, bus: plc, node: 'ns=1;s=Temperature'}") +
		readCap("numeric", "float", "{type: opcua, bus: plc, node: 'nsu=urn:physd:opcua-test-server;i=1001'}") +
		readCap("broken", "float", "{type: opcua, bus: plc, node: 'ns=1;s=Broken'}") +
		readCap("drifting", "float", "{type: opcua, bus: plc, node: 'ns=1;s=Drifting'}") +
		readCap("wrongtype", "float", "{type: opcua, bus: plc, node: 'ns=1;s=Gain'}") +
		readCap("curve", "float", "{type: opcua, bus: plc, node: 'ns=1;s=Curve'}") +
		readCap("missing", "float", "{type: opcua, bus: plc, node: 'ns=1;s=NoSuchNode'}") +
		doCap("curve2", "float", "{type: opcua, bus: plc, node: 'ns=1;s=Curve', index: 2}") +
		doCap("setpoint", "float", "{type: opcua, bus: plc, node: 'nsu=urn:physd:opcua-test-server;s=Setpoint'}") +
		doCap("gain", "float", "{type: opcua, bus: plc, node: 'ns=1;s=Gain', ua_type: Float}") +
		doCap("level", "int", "{type: opcua, bus: plc, node: 'ns=1;s=Level', ua_type: Int16}") +
		doCap("locked", "float", "{type: opcua, bus: plc, node: 'ns=1;s=Locked'}") +
		doCap("ghost", "float", "{type: opcua, bus: plc, node: 'nsu=urn:no-such-namespace;s=Setpoint'}") +
		"  - name: pump\n    kind: do\n    description: d\n    data_type: bool\n    semantic_tags: [t]\n    binding: {type: opcua, bus: plc, node: 'ns=1;s=Pump'}\n" +
		"  - name: mode\n    kind: do\n    description: d\n    data_type: enum\n    enum_values: [auto, manual]\n    semantic_tags: [t]\n    binding: {type: opcua, bus: plc, node: 'ns=1;s=Mode'}\n"
	return openAll(t, mustParse(t, bus, caps))
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	t.Cleanup(cancel)
	return c
}

func read(t *testing.T, p drivers.Point) drivers.Reading {
	t.Helper()
	r, err := p.Read(ctx(t))
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return r
}

func TestOPCUAServerReadWrite(t *testing.T) {
	srv := opcuatest.Start(t, opcuatest.Options{})
	b, p := plant(t, srv.Endpoint, "")

	if r := read(t, p["temperature"]); r.Uncertain != "" || r.Value.(float64) < 21 || r.Value.(float64) > 22 {
		t.Fatalf("temperature %+v", r)
	}
	if err := b.Health(); err != nil {
		t.Fatalf("health after a read: %v", err)
	}
	if r := read(t, p["numeric"]); r.Value != 7.25 {
		t.Fatalf("numeric (nsu= form) %+v", r)
	}

	// Status codes: Bad is an error carrying the code name, Uncertain a
	// reading that says so.
	_, err := p["broken"].Read(ctx(t))
	wantErr(t, err, "BadSensorFailure")
	if code, _, ok := drivers.CodeOf(err); !ok || code != "BadSensorFailure" {
		t.Fatalf("code %q ok %v", code, ok)
	}
	if r := read(t, p["drifting"]); r.Value != 19.75 || !strings.Contains(r.Uncertain, "UncertainLastUsableValue") {
		t.Fatalf("drifting %+v", r)
	}
	_, err = p["missing"].Read(ctx(t))
	wantErr(t, err, "BadNodeIdUnknown")
	_, err = p["wrongtype"].Read(ctx(t))
	wantErr(t, err, "holds a Float", "ua_type Double")
	_, err = p["curve"].Read(ctx(t))
	wantErr(t, err, "array of 4", "index")
	if r := read(t, p["curve2"]); r.Value != 3.0 {
		t.Fatalf("curve[2] %+v", r)
	}

	// Writes, read back.
	for _, c := range []struct {
		name string
		v    any
	}{{"setpoint", 42.5}, {"gain", 0.25}, {"level", int64(-7)}, {"pump", true}, {"mode", "manual"}, {"curve2", 9.5}} {
		if err := p[c.name].Write(ctx(t), c.v); err != nil {
			t.Fatalf("write %s: %v", c.name, err)
		}
		if r := read(t, p[c.name]); r.Value != c.v {
			t.Fatalf("%s read back %v (%T), wrote %v", c.name, r.Value, r.Value, c.v)
		}
	}

	// EURange: refused before anything is sent.
	err = p["setpoint"].Write(ctx(t), 150.0)
	wantErr(t, err, "outside the EURange 0..100", "nothing written")
	if !errors.Is(err, drivers.ErrBadValue) {
		t.Fatalf("EURange refusal does not wrap ErrBadValue: %v", err)
	}
	if code, fix, _ := drivers.CodeOf(err); code != "outside_eu_range" || !strings.Contains(fix, "between 0 and 100") {
		t.Fatalf("code %q fix %q", code, fix)
	}
	if r := read(t, p["setpoint"]); r.Value != 42.5 {
		t.Fatalf("setpoint after the refusal: %v", r.Value)
	}
	// A node without EURange takes any value its type holds.
	if err := p["gain"].Write(ctx(t), 1000.0); err != nil {
		t.Fatal(err)
	}

	// A namespace the server does not have: nothing is sent.
	_, err = p["ghost"].Read(ctx(t))
	wantErr(t, err, "BadNodeIdUnknown", "no namespace \"urn:no-such-namespace\"")
	err = p["ghost"].Write(ctx(t), 1.0)
	if !errors.Is(err, drivers.ErrOffline) {
		t.Fatalf("write to an unknown namespace: %v, want nothing sent", err)
	}
	if code, _, _ := drivers.CodeOf(err); code != "BadNodeIdUnknown" {
		t.Fatalf("code %q", code)
	}

	// A Bad write result: the server applied nothing.
	err = p["locked"].Write(ctx(t), 1.0)
	wantErr(t, err, "BadNotWritable")
	if !errors.Is(err, drivers.ErrBadValue) {
		t.Fatalf("a Bad write result does not wrap ErrBadValue: %v", err)
	}
	if code, _, _ := drivers.CodeOf(err); code != "BadNotWritable" {
		t.Fatalf("code %q", code)
	}
}

// TestOPCUAServerRestart: the server restarts (every value back at its
// initial one); reads fail while it is down, then a new session serves the
// server's new values, never the one from before.
func TestOPCUAServerRestart(t *testing.T) {
	srv := opcuatest.Start(t, opcuatest.Options{})
	b, p := plant(t, srv.Endpoint, "")
	if err := p["setpoint"].Write(ctx(t), 42.0); err != nil {
		t.Fatal(err)
	}
	if r := read(t, p["setpoint"]); r.Value != 42.0 {
		t.Fatalf("read back %v", r.Value)
	}
	srv.Stop()
	_, err := p["setpoint"].Read(ctx(t))
	if err == nil {
		t.Fatal("a read with the server down succeeded")
	}
	if b.Health() == nil {
		t.Fatal("health nil with the server down")
	}
	// With the server down, a write is refused before it is sent.
	if err := p["setpoint"].Write(ctx(t), 43.0); !errors.Is(err, drivers.ErrOffline) {
		time.Sleep(300 * time.Millisecond)
		if err := p["setpoint"].Write(ctx(t), 43.0); !errors.Is(err, drivers.ErrOffline) {
			t.Fatalf("write with the server down: %v", err)
		}
	}
	srv.Restart()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, err := p["setpoint"].Read(ctx(t))
		if err == nil {
			if r.Value != 20.0 {
				t.Fatalf("after the restart the setpoint reads %v, the server holds 20", r.Value)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no read 20 s after the restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := b.Health(); err != nil {
		t.Fatalf("health after reconnect: %v", err)
	}
}

// TestOPCUAServerConnectDeadline: a read against an endpoint where nobody
// answers OPC UA ends within its own deadline.
func TestOPCUAServerConnectDeadline(t *testing.T) {
	_, p := plant(t, "opc.tcp://10.255.255.1:4840/none", "")
	c, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := p["temperature"].Read(c)
	if !errors.Is(err, drivers.ErrOffline) || time.Since(start) > 2*time.Second {
		t.Fatalf("read took %v: %v", time.Since(start), err)
	}
}

func TestOPCUAServerSecure(t *testing.T) {
	srv := opcuatest.Start(t, opcuatest.Options{Secure: true, User: "operator:s3cret"})
	t.Setenv("PHYSD_TEST_OPCUA_PW", "s3cret")
	for _, mode := range []string{ModeSignAndEncrypt, ModeSign} {
		t.Run(mode, func(t *testing.T) {
			_, p := plant(t, srv.Endpoint, ", security_policy: Basic256Sha256, security_mode: "+mode+
				", server_certificate: "+srv.ServerCertificate()+", username: operator, password_env: PHYSD_TEST_OPCUA_PW")
			if err := p["setpoint"].Write(ctx(t), 33.0); err != nil {
				t.Fatal(err)
			}
			if r := read(t, p["setpoint"]); r.Value != 33.0 {
				t.Fatalf("read back %v", r.Value)
			}
		})
	}
	// The Aes policies (OPC UA 1.04): RSA-OAEP-SHA256 and RSA-PSS
	// asymmetric, AES-128/256-CBC with HMAC-SHA256 symmetric.
	for _, policy := range []string{PolicyAes128, PolicyAes256} {
		t.Run(policy, func(t *testing.T) {
			_, p := plant(t, srv.Endpoint, ", security_policy: "+policy+", security_mode: SignAndEncrypt"+
				", server_certificate: "+srv.ServerCertificate()+", username: operator, password_env: PHYSD_TEST_OPCUA_PW")
			if err := p["setpoint"].Write(ctx(t), 34.0); err != nil {
				t.Fatal(err)
			}
			if r := read(t, p["setpoint"]); r.Value != 34.0 {
				t.Fatalf("read back %v", r.Value)
			}
		})
	}
	t.Run("no security", func(t *testing.T) {
		_, p := plant(t, srv.Endpoint, "")
		_, err := p["temperature"].Read(ctx(t))
		wantErr(t, err, "no endpoint with security_policy None")
	})
	t.Run("wrong password", func(t *testing.T) {
		t.Setenv("PHYSD_TEST_OPCUA_PW", "wrong")
		_, p := plant(t, srv.Endpoint, ", security_policy: Basic256Sha256, server_certificate: "+srv.ServerCertificate()+", username: operator, password_env: PHYSD_TEST_OPCUA_PW")
		_, err := p["temperature"].Read(ctx(t))
		wantErr(t, err, "BadUserAccessDenied")
	})
	t.Run("trust list", func(t *testing.T) {
		_, p := plant(t, srv.Endpoint, ", security_policy: Basic256Sha256, server_trust: ["+srv.ServerCertificate()+"], username: operator, password_env: PHYSD_TEST_OPCUA_PW")
		if r := read(t, p["numeric"]); r.Value != 7.25 {
			t.Fatalf("read %v", r.Value)
		}
	})
	t.Run("untrusted server", func(t *testing.T) {
		der, _, err := generateCert("urn:some-ca")
		if err != nil {
			t.Fatal(err)
		}
		other := filepath.Join(t.TempDir(), "ca.der")
		if err := os.WriteFile(other, der, 0o600); err != nil {
			t.Fatal(err)
		}
		_, p := plant(t, srv.Endpoint, ", security_policy: Basic256Sha256, server_trust: ["+other+"], username: operator, password_env: PHYSD_TEST_OPCUA_PW")
		_, err = p["temperature"].Read(ctx(t))
		wantErr(t, err, "is not trusted by server_trust", "refusing to connect")
		if code, _, _ := drivers.CodeOf(err); code != "server_certificate_mismatch" {
			t.Fatalf("code %q", code)
		}
	})
	t.Run("wrong server certificate", func(t *testing.T) {
		der, _, err := generateCert("urn:impostor")
		if err != nil {
			t.Fatal(err)
		}
		other := filepath.Join(t.TempDir(), "other.der")
		if err := os.WriteFile(other, der, 0o600); err != nil {
			t.Fatal(err)
		}
		_, p := plant(t, srv.Endpoint, ", security_policy: Basic256Sha256, server_certificate: "+other+", username: operator, password_env: PHYSD_TEST_OPCUA_PW")
		_, err = p["temperature"].Read(ctx(t))
		wantErr(t, err, "is not the pinned server_certificate", fingerprint(der))
		if !errors.Is(err, drivers.ErrOffline) {
			t.Fatalf("not ErrOffline: %v", err)
		}
	})
}

// TestOPCUAServerLostWriteReply: the write reaches the server, its reply
// is lost: the error says the write may have been applied (not ErrOffline,
// not ErrBadValue, so the node answers partial/outcome_unknown), and the
// next read opens a new session and shows the value the server holds.
func TestOPCUAServerLostWriteReply(t *testing.T) {
	srv := opcuatest.Start(t, opcuatest.Options{})
	px := opcuatest.StartLossProxy(t, srv)
	_, p := plant(t, px.Endpoint, ", timeout_ms: 500")
	if r := read(t, p["setpoint"]); r.Value != 20.0 {
		t.Fatalf("setpoint %v", r.Value)
	}
	px.Arm()
	c, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	err := p["setpoint"].Write(c, 61.0)
	if err == nil || errors.Is(err, drivers.ErrOffline) || errors.Is(err, drivers.ErrBadValue) {
		t.Fatalf("write with its reply lost: %v, want an error that leaves the outcome open", err)
	}
	wantErr(t, err, "may have been applied")
	if px.Lost() != 1 {
		t.Fatalf("the proxy dropped %d replies", px.Lost())
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := p["setpoint"].Read(ctx(t))
		if err == nil {
			if r.Value != 61.0 {
				t.Fatalf("after the lost reply the server holds %v, want 61 (the write landed)", r.Value)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no read after the lost reply: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// writeUserCert writes a generated certificate and key as PEM files.
func writeUserCert(t *testing.T, uri string) (cert, key string) {
	t.Helper()
	der, k, err := generateCert(uri)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cert, key = filepath.Join(dir, "user.pem"), filepath.Join(dir, "user.key")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// TestOPCUAServerUserCertificate: an X.509 user identity the server
// trusts opens a session; another certificate is refused; the endpoint
// takes no anonymous session.
func TestOPCUAServerUserCertificate(t *testing.T) {
	cert, key := writeUserCert(t, "urn:physd:user:operator")
	srv := opcuatest.Start(t, opcuatest.Options{Secure: true, UserCert: cert})
	_, p := plant(t, srv.Endpoint, ", security_policy: Basic256Sha256, server_certificate: "+srv.ServerCertificate()+
		", user_certificate: "+cert+", user_private_key: "+key)
	if err := p["setpoint"].Write(ctx(t), 44.0); err != nil {
		t.Fatal(err)
	}
	if r := read(t, p["setpoint"]); r.Value != 44.0 {
		t.Fatalf("read back %v", r.Value)
	}

	otherCert, otherKey := writeUserCert(t, "urn:physd:user:intruder")
	_, p2 := plant(t, srv.Endpoint, ", security_policy: Basic256Sha256, server_certificate: "+srv.ServerCertificate()+
		", user_certificate: "+otherCert+", user_private_key: "+otherKey)
	_, err := p2["temperature"].Read(ctx(t))
	wantErr(t, err, "BadIdentityTokenRejected")
	if code, fix, _ := drivers.CodeOf(err); code != "BadIdentityTokenRejected" || !strings.Contains(fix, "user_certificate") {
		t.Fatalf("code %q fix %q", code, fix)
	}
	_, p3 := plant(t, srv.Endpoint, ", security_policy: Basic256Sha256, server_certificate: "+srv.ServerCertificate())
	_, err = p3["temperature"].Read(ctx(t))
	wantErr(t, err, "takes no UserTokenTypeAnonymous identity")
	if code, _, _ := drivers.CodeOf(err); code != "identity_not_offered" {
		t.Fatalf("code %q", code)
	}
}

// TestOPCUAServerShortSessionTimeout: a server that grants a session
// timeout far shorter than the minute physd asks for (a PLC revising the
// request down) ends a session that sends nothing for that long. physd
// keeps its idle session open: a read and a write after quiet spells
// longer than the timeout go through on the session it has.
func TestOPCUAServerShortSessionTimeout(t *testing.T) {
	srv := opcuatest.Start(t, opcuatest.Options{SessionTimeout: 1000})
	b, p := plant(t, srv.Endpoint, "")
	read(t, p["temperature"])
	for i := range 2 {
		time.Sleep(2500 * time.Millisecond) // idle: 2.5 session timeouts
		if err := b.Health(); err != nil {
			t.Fatalf("health after a quiet spell: %v", err)
		}
		if i == 0 {
			if _, err := p["temperature"].Read(ctx(t)); err != nil {
				t.Fatalf("read after a quiet spell longer than the session timeout: %v", err)
			}
			continue
		}
		if err := p["setpoint"].Write(ctx(t), 12.0); err != nil {
			t.Fatalf("write after a quiet spell longer than the session timeout: %v", err)
		}
	}
}

// TestOPCUAServerWriteGoodClamped: a write the server accepts with a Good
// sub-code (GoodClamped: it kept a value of its own) was applied, so it
// is no refusal (a Bad result's ErrBadValue would make the node answer
// failed, "nothing changed"): Write returns nil and the node's read-back
// finds the value the server kept.
func TestOPCUAServerWriteGoodClamped(t *testing.T) {
	srv := opcuatest.Start(t, opcuatest.Options{})
	_, p := openAll(t, mustParse(t, "{type: opcua, endpoint: '"+srv.Endpoint+"', connect_timeout_ms: 10000}",
		doCap("clamped", "float", "{type: opcua, bus: plc, node: 'ns=1;s=Clamped'}")))
	if err := p["clamped"].Write(ctx(t), 80.0); err != nil {
		t.Fatalf("a write answered GoodClamped is an error (errors.Is ErrBadValue %v): %v", errors.Is(err, drivers.ErrBadValue), err)
	}
	if r := read(t, p["clamped"]); r.Value != 50.0 {
		t.Fatalf("read back %v, the server keeps 50", r.Value)
	}
}

// TestOPCUAServerPinOnReconnect: the pinned certificate is checked at
// every connect, not only the first: the server restarts with another
// certificate (a replaced box, an impostor on its address), and no read
// after that is served; each says the certificate is not the pinned one.
func TestOPCUAServerPinOnReconnect(t *testing.T) {
	srv := opcuatest.Start(t, opcuatest.Options{Secure: true, User: "operator:s3cret"})
	t.Setenv("PHYSD_TEST_OPCUA_PW", "s3cret")
	b, p := plant(t, srv.Endpoint, ", security_policy: Basic256Sha256, server_certificate: "+srv.ServerCertificate()+
		", username: operator, password_env: PHYSD_TEST_OPCUA_PW")
	read(t, p["temperature"])
	pinned, err := os.ReadFile(srv.ServerCertificate())
	if err != nil {
		t.Fatal(err)
	}
	srv.RestartWith(func(o *opcuatest.Options) { o.PKI = filepath.Join(t.TempDir(), "another-pki") })
	if now, _ := os.ReadFile(srv.ServerCertificate()); bytes.Equal(now, pinned) {
		t.Fatal("the restarted server kept its certificate")
	}
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, err := p["temperature"].Read(ctx(t))
		if err == nil {
			t.Fatal("a read after the server came back with another certificate was served")
		}
		if code, _, _ := drivers.CodeOf(err); code == "server_certificate_mismatch" {
			wantErr(t, err, "is not the pinned server_certificate")
			break
		}
		if time.Now().After(end) {
			t.Fatalf("no certificate mismatch within 10 s: %v", err)
		}
	}
	if err := b.Health(); err == nil {
		t.Fatal("healthy with a server whose certificate is not the pinned one")
	}
}

// TestOPCUAServerWriteServiceFault: a server that refuses a Write as a
// whole (a ServiceFault, here BadUserAccessDenied for a user without
// write rights) executed nothing: the write is a refusal with the status
// name as code (the node answers failed), not a lost reply ("may have been
// applied"), and the session stays.
func TestOPCUAServerWriteServiceFault(t *testing.T) {
	srv := opcuatest.Start(t, opcuatest.Options{WriteFault: "BadUserAccessDenied"})
	b, p := plant(t, srv.Endpoint, "")
	err := p["setpoint"].Write(ctx(t), 30.0)
	wantErr(t, err, "BadUserAccessDenied")
	if code, _, _ := drivers.CodeOf(err); code != "BadUserAccessDenied" || !errors.Is(err, drivers.ErrBadValue) {
		t.Fatalf("code %q, ErrBadValue %v: %v", code, errors.Is(err, drivers.ErrBadValue), err)
	}
	if r := read(t, p["setpoint"]); r.Value != 20.0 {
		t.Fatalf("the server holds %v", r.Value)
	}
	if err := b.Health(); err != nil {
		t.Fatalf("health: %v", err)
	}
}
