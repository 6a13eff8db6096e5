package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/history"
	"github.com/physd/physd/manifest"
)

// Active alarms across sites: each gateway keeps the set of alarms its
// engine holds raised now on <prefix>.<site>.<device>.alarms in the alarm
// stream, the last message per subject being the state (a stream physd
// creates keeps only that one).
//
// Why a state subject and not a derivation from the audit stream, where
// the alarm_raised and alarm_cleared records already are: the audit does
// not say everything the state depends on (a gateway that restarts
// starts with no alarm raised and writes no alarm_cleared for the ones
// it held; an acknowledgement is an audit record too, but which raise it
// belongs to is the engine's rule), and deriving it would read every
// device's whole trail for every query, growing with the stream's age.
// The state subject is what the engine holds (alarms.Engine.Active),
// read in one pass of one message per device. It is kept in step the way
// the audit's copy is: each snapshot is conditional on the subject's
// last stream sequence (a snapshot delayed in a stalled link can never
// overwrite a newer one), the uplink compares with what the stream holds
// at every sync, and publishes again after a cut; the audit stays the
// record of how the state came about.

// AlarmState is one device's active alarms, as its alarm engine held
// them at At.
type AlarmState struct {
	Site   string    `json:"site"`
	Device string    `json:"device"`
	At     time.Time `json:"at"`
	// AuditSeq is the gateway's last audit seq at At: the alarm records
	// up to it are reflected.
	AuditSeq uint64          `json:"audit_seq"`
	Active   []alarms.Active `json:"active"`
}

// AlarmSubjects are the subjects of an alarm stream physd creates.
func AlarmSubjects(prefix string) []string { return []string{prefix + ".*.*.alarms"} }

// AlarmStateSubject is the subject of this gateway's alarm state.
func (u *Uplink) AlarmStateSubject() string { return u.base + ".alarms" }

// FollowAlarms keeps the hub's copy of e's active alarms (nothing when
// network.fleet.alarms is off): after every alarm event and every
// Config.Refresh, when the state differs from the stream's.
func (u *Uplink) FollowAlarms(e *alarms.Engine) {
	if !u.cfg.Alarms || e == nil {
		return
	}
	nudge := make(chan struct{}, 1)
	e.OnEvent(func(alarms.Event) {
		select {
		case nudge <- struct{}{}:
		default:
		}
	})
	u.done.Add(1)
	go func() {
		defer u.done.Done()
		u.alarmLoop(e, nudge)
	}()
}

func (u *Uplink) alarmLoop(e *alarms.Engine, nudge chan struct{}) {
	tick := time.NewTicker(u.cfg.Refresh)
	defer tick.Stop()
	var (
		c      *chain
		synced bool
		conn   uint64          // the connection it synced on
		held   []alarms.Active // what the stream holds, as of the last sync or ack
	)
	for {
		select {
		case <-u.stop:
			return
		case <-nudge:
		case <-tick.C:
		}
		nc := u.nc.Load()
		if nc == nil || !nc.IsConnected() {
			continue
		}
		if c == nil {
			c = &chain{life: u.life, js: u.js, nc: nc, subject: u.AlarmStateSubject(), timeout: u.cfg.PublishTimeout, window: 1}
		}
		err := func() error {
			if now := u.conns.Load(); !synced || conn != now {
				conn = now
				create := AlarmStreamConfig(u.cfg.AlarmStream, u.cfg.Prefix, 1)
				msg, err := c.sync(u.cfg.AlarmStream, &create)
				if err != nil {
					return err
				}
				held = nil
				if msg != nil {
					var st AlarmState
					if err := json.Unmarshal(msg.Data, &st); err != nil {
						return fmt.Errorf("the last message of %s is not an alarm state: %w", c.subject, err)
					}
					held = st.Active
				}
				synced = true
			}
			active := e.Active()
			if sameAlarms(active, held) {
				return nil
			}
			st := AlarmState{Site: u.cfg.Site, Device: u.cfg.DeviceID, At: time.Now().UTC(), Active: active}
			if u.al != nil {
				st.AuditSeq = u.al.Seq()
			}
			b, err := json.Marshal(st)
			if err != nil {
				return err
			}
			m := nats.NewMsg(c.subject)
			m.Data = b
			m.Header.Set(HeaderDevice, u.cfg.DeviceID)
			if _, err := c.send([]*nats.Msg{m}); err != nil {
				synced = false
				if errors.Is(err, errResync) {
					return nil // compared again at the next sync
				}
				return fmt.Errorf("%s: %w", c.subject, err)
			}
			held = active
			u.alarmPublished.Add(1)
			return nil
		}()
		u.note(&u.alarmErr, "alarms", "fleet: the active alarms are not copied yet; retrying", err)
	}
}

// sameAlarms compares two states as they serialize (time zones aside).
func sameAlarms(a, b []alarms.Active) bool {
	if len(a) != len(b) {
		return false
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	var va, vb any
	_ = json.Unmarshal(ja, &va)
	_ = json.Unmarshal(jb, &vb)
	return reflect.DeepEqual(va, vb)
}

// DeviceAlarms is one device's alarm state as the hub holds it.
type DeviceAlarms struct {
	AlarmState
	// Stored is when the hub stored it (the hub's clock): a site whose
	// link is down keeps showing its last state, this old.
	Stored time.Time `json:"stored"`
}

// AlarmReader reads the active alarms across sites from the hub's alarm
// stream: what the fleet endpoint serves. Its user needs the stream's
// ordered consumers (CONSUMER.CREATE, CONSUMER.MSG.NEXT, CONSUMER.DELETE).
type AlarmReader struct {
	JS     jetstream.JetStream
	Stream string // default manifest.DefaultFleetAlarmStream
	Prefix string // default physd
	// MaxDevices bounds one answer (default 10000).
	MaxDevices int
}

// defaults are r with its defaults filled in.
func (r *AlarmReader) defaults() AlarmReader {
	c := *r
	if c.Stream == "" {
		c.Stream = "PHYSD_ALARMS"
	}
	if c.Prefix == "" {
		c.Prefix = "physd"
	}
	if c.MaxDevices <= 0 {
		c.MaxDevices = 10000
	}
	return c
}

// filter is the subjects of site's states (every site's with site "").
func (r *AlarmReader) filter(site string) (string, error) {
	if site == "" {
		return r.Prefix + ".*.*.alarms", nil
	}
	if !manifest.IsSubjectToken(site) {
		return "", &history.QueryError{Msg: fmt.Sprintf("site: %q is not a site name (letters, digits, _ and -)", site)}
	}
	return r.Prefix + "." + site + ".*.alarms", nil
}

// Active is the last alarm state of every device of site (every site
// with site ""), by site and device.
func (r *AlarmReader) Active(ctx context.Context, site string) ([]DeviceAlarms, error) {
	c := r.defaults()
	filter, err := c.filter(site)
	if err != nil {
		return nil, err
	}
	var out []DeviceAlarms
	err = scan(ctx, c.JS, c.Stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy},
		c.MaxDevices, func(m jetstream.Msg) (bool, error) {
			if d, ok := deviceAlarmsOf(m); ok {
				out = append(out, d)
			}
			return false, nil
		})
	if err != nil {
		return nil, err
	}
	sortDevices(out)
	return out, nil
}

// Follow calls fn with the last alarm state of every device of site
// (every site's with site ""), then with each state the stream stores
// after it, until ctx ends: an ordered consumer, which starts again after
// the last state it delivered when the connection or the stream's leader
// changes. fn runs on the consumer's goroutine.
func (r *AlarmReader) Follow(ctx context.Context, site string, fn func(DeviceAlarms)) error {
	c := r.defaults()
	filter, err := c.filter(site)
	if err != nil {
		return err
	}
	cons, err := c.JS.OrderedConsumer(ctx, c.Stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy})
	if err != nil {
		return fmt.Errorf("following %s: %w", c.Stream, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if d, ok := deviceAlarmsOf(m); ok {
			fn(d)
		}
	})
	if err != nil {
		return fmt.Errorf("following %s: %w", c.Stream, err)
	}
	go func() {
		<-ctx.Done()
		cc.Stop()
	}()
	return nil
}

// deviceAlarmsOf reads one stored alarm state. The subject names the site
// and device, not the payload: the hub's permissions hold a site to its
// own subjects.
func deviceAlarmsOf(m jetstream.Msg) (DeviceAlarms, bool) {
	var d DeviceAlarms
	if err := json.Unmarshal(m.Data(), &d.AlarmState); err != nil {
		return d, false // not an alarm state: skipped
	}
	t := splitSubject(m.Subject())
	if len(t) < 3 {
		return d, false
	}
	d.Site, d.Device = t[len(t)-3], t[len(t)-2]
	if meta, err := m.Metadata(); err == nil {
		d.Stored = meta.Timestamp.UTC()
	}
	if d.Active == nil {
		d.Active = []alarms.Active{}
	}
	return d, true
}

func sortDevices(ds []DeviceAlarms) {
	sort.Slice(ds, func(i, j int) bool {
		if ds[i].Site != ds[j].Site {
			return ds[i].Site < ds[j].Site
		}
		return ds[i].Device < ds[j].Device
	})
}
