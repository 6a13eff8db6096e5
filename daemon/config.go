package daemon

import (
	"log/slog"
	"time"

	"github.com/physd/physd/gate"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mqtt"
	"github.com/physd/physd/policy"
)

// Config is what `physd run`'s flags produce once preflight has checked
// the files: the daemon opens nothing New has not been given here.
type Config struct {
	ManifestPath string
	Manifest     *manifest.Manifest // parsed and its bindings checked
	ManifestSum  [32]byte           // the checked file's content (what --watch-manifest compares)
	PolicyPath   string             // "" without --policy
	Policy       *policy.Policy     // nil without --policy
	Gate         *gate.Gate
	StateDir     string

	HTTPAddr      string // "" with --stdio only (New defaults it otherwise)
	Stdio         bool
	AllowRemote   bool
	TokenFile     string
	StdioRole     string
	View          string
	Families      string // auto, on or off
	SimControl    bool
	TLS           TLS
	MDNSInterface string
	MQTT          *mqtt.Config // nil without --mqtt-url
	// FleetUplink is network.fleet with physd run's --fleet-* flags
	// applied (fleet.Flags.Apply); nil: the manifest's block as it is.
	FleetUplink *manifest.Fleet

	Grace         time.Duration // each component's stop, and the listeners' drain
	WatchManifest time.Duration
	HistoryMaxAge time.Duration
	HistoryMaxMB  int

	Version string // the build's, for the gate and the ready line
	Logger  *slog.Logger

	// Fleet, when set, makes this the fleet endpoint (physd fleet): the
	// manifest (ManifestPath "") is the endpoint's own, without
	// capabilities, and Fleet lists, routes and answers can_do for the
	// sites' gateways over NATS.
	Fleet FleetEndpoint
}

// TLS is how the HTTP listener is exposed.
type TLS struct {
	Cert, Key, ClientCA string
	InsecurePlainHTTP   bool
	AllowedHosts        []string
}
