//go:build nohub

package hub

import (
	"errors"

	"github.com/nats-io/nats.go"
)

// Hub is the embedded hub, absent from this build.
type Hub struct{}

// Start says that this build has no embedded hub.
func Start(Config) (*Hub, error) {
	return nil, errors.New("this physd was built with -tags nohub, without the embedded NATS hub; fix: connect to a NATS cluster (nats: in the fleet configuration), or use a build without the tag")
}

// Addr, URL, ClientOptions and Shutdown are never reached: Start fails.
func (*Hub) Addr() string                 { return "" }
func (*Hub) URL() string                  { return "" }
func (*Hub) ClientOptions() []nats.Option { return nil }
func (*Hub) Shutdown()                    {}
