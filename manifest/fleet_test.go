package manifest

import (
	"reflect"
	"strings"
	"testing"
)

// fleetDoc is a valid manifest with network.fleet as the given flow
// mapping on line 9, column 10.
func fleetDoc(fleet string) string {
	return strings.Replace(header, "  mesh: {}\n", "  mesh: {}\n  fleet: "+fleet+"\n", 1) + okCap
}

func TestFleetKeys(t *testing.T) {
	m, err := Parse("t.yml", []byte(fleetDoc(`{urls: ["tls://hub.example:4222", "tls://hub2.example:4222"], site: north,
    credentials_file: /etc/physd/site.creds, tls: {ca: /etc/physd/hub-ca.pem, cert: c.pem, key: k.pem},
    stream: SITES, subject_prefix: acme.physd, connect_timeout_ms: 2000, publish_timeout_ms: 3000,
    domain: hub, history: false, history_stream: H, alarms: false, alarm_stream: A, serve: [read, do]}`)))
	if err != nil {
		t.Fatal(err)
	}
	want := &Fleet{Enabled: true, URLs: []string{"tls://hub.example:4222", "tls://hub2.example:4222"}, Site: "north",
		CredentialsFile: "/etc/physd/site.creds", TLSCA: "/etc/physd/hub-ca.pem", TLSCert: "c.pem", TLSKey: "k.pem",
		Stream: "SITES", SubjectPrefix: "acme.physd", ConnectTimeoutMS: 2000, PublishTimeoutMS: 3000,
		Domain: "hub", HistoryStream: "H", AlarmStream: "A", Serve: []string{"read", "do"}}
	if !reflect.DeepEqual(m.Network.Fleet, want) {
		t.Errorf("fleet =\n %+v\nwant\n %+v", m.Network.Fleet, want)
	}
	if !m.Network.Fleet.UsesTLS() {
		t.Error("UsesTLS = false")
	}
	if f := m.Network.Fleet; !f.Serves("do") || f.Serves("can_do") {
		t.Errorf("serve: [read, do]: Serves(do) %v, Serves(can_do) %v", f.Serves("do"), f.Serves("can_do"))
	}

	m, err = Parse("t.yml", []byte(fleetDoc(`{urls: [nats://127.0.0.1:4222], site: s1, user: gw, password_file: /run/pw}`)))
	if err != nil {
		t.Fatal(err)
	}
	want = &Fleet{Enabled: true, URLs: []string{"nats://127.0.0.1:4222"}, Site: "s1", User: "gw", PasswordFile: "/run/pw",
		Stream: DefaultFleetStream, SubjectPrefix: DefaultFleetSubjectPrefix,
		History: true, HistoryStream: DefaultFleetHistoryStream, Alarms: true, AlarmStream: DefaultFleetAlarmStream, ConnectTimeoutMS: DefaultFleetConnectTimeoutMS, PublishTimeoutMS: DefaultFleetPublishTimeoutMS,
		Serve: []string{"read", "can_do"}}
	if !reflect.DeepEqual(m.Network.Fleet, want) {
		t.Errorf("fleet =\n %+v\nwant\n %+v", m.Network.Fleet, want)
	}
	if f := m.Network.Fleet; f.Serves("do") || !f.Serves("read") {
		t.Errorf("default serve: Serves(do) %v, Serves(read) %v: safe by default is read and can_do", f.Serves("do"), f.Serves("read"))
	}
	m, err = Parse("t.yml", []byte(fleetDoc(`{urls: [nats://127.0.0.1:4222], site: s1, serve: []}`)))
	if err != nil || len(m.Network.Fleet.Serve) != 0 || m.Network.Fleet.Serves("read") {
		t.Errorf("serve: []: %v, %+v", err, m.Network.Fleet)
	}

	m, err = Parse("t.yml", []byte(header+okCap))
	if err != nil || m.Network.Fleet != nil {
		t.Fatalf("no fleet block: %v, %+v", err, m.Network.Fleet)
	}
}

func TestFleetErrors(t *testing.T) {
	for _, tc := range []struct{ fleet, want string }{
		{`{site: s1}`, `t.yml:9:10: network.fleet.urls: missing required key "urls"`},
		{`{urls: [], site: s1}`, `network.fleet.urls: urls must not be empty`},
		{`{urls: ["http://h:4222"], site: s1}`, `t.yml:9:18: network.fleet.urls[0]: invalid NATS URL "http://h:4222"`},
		{`{urls: ["nats://u:p@h:4222"], site: s1}`, `invalid NATS URL`},
		{`{urls: [nats://h:4222], site: a.b}`, `t.yml:9:40: network.fleet.site: invalid site "a.b"`},
		{`{urls: [nats://h:4222]}`, `missing required key "site"`},
		{`{urls: [nats://h:4222], site: s, user: u, credentials_file: f}`, `network.fleet.user: credentials_file and user are two ways to authenticate`},
		{`{urls: [nats://h:4222], site: s, password_file: p}`, `password_file without user`},
		{`{urls: [tls://h:4222], site: s, tls: {cert: c}}`, `tls.cert and tls.key go together`},
		{`{urls: [nats://h:4222], site: s, tls: {ca: c}}`, `a tls block with the plain URL nats://h:4222`},
		{`{urls: [nats://h:4222], site: s, stream: "a b"}`, `invalid stream "a b"`},
		{`{urls: [nats://h:4222], site: s, subject_prefix: "a.*"}`, `invalid subject_prefix`},
		{`{urls: [nats://h:4222], site: s, connect_timeout_ms: 5}`, `connect_timeout_ms 5 is out of range`},
		{`{urls: [nats://h:4222], site: s, domain: "a.b"}`, `invalid domain "a.b"`},
		{`{urls: [nats://h:4222], site: s, history_stream: "a b"}`, `invalid history_stream "a b"`},
		{`{urls: [nats://h:4222], site: s, alarms: maybe}`, `network.fleet.alarms`},
		{`{urls: [nats://h:4222], site: s, sitee: x}`, `unknown key "sitee"; fix: did you mean "site"?`},
		{`{urls: [nats://h:4222], site: s, serve: [read, write]}`, `network.fleet.serve[1]: unknown "write"; fix: use one of read, can_do, do`},
		{`{urls: [nats://h:4222], site: s, serve: [do, do]}`, `network.fleet.serve[1]: "do" is listed twice`},
	} {
		_, err := Parse("t.yml", []byte(fleetDoc(tc.fleet)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s:\n got  %v\n want %s", tc.fleet, err, tc.want)
		}
	}
}
