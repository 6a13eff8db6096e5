package mqtt

import (
	"encoding/json"
	"sort"
	"strings"

	"github.com/physd/physd/manifest"
)

// Reload follows a manifest reload (the device id cannot change): the
// discovery configs the new manifest adds or changes are published, those
// of capabilities it no longer has as a read_ (removed, or now another
// entity type) are removed with an empty retained payload, and so are the
// retained obs/, alarm/ and do/ topics of tools it no longer declares.
// It does not wait for the broker: the publishing goroutine sends the
// changes, and on every reconnect the whole state in force again.
func (p *Publisher) Reload(m *manifest.Manifest) {
	tools := toolsOf(m)
	p.mu.Lock()
	defer p.mu.Unlock()
	oldCfg, newCfg := p.discovery(p.m), p.discovery(m)
	p.m, p.tools = m, tools
	var changes []message
	for t, b := range newCfg {
		if string(oldCfg[t]) != string(b) {
			changes = append(changes, message{topic: t, payload: b, retained: true})
			delete(p.removed, t)
		}
	}
	var gone []string
	for t := range oldCfg {
		if newCfg[t] == nil {
			gone = append(gone, t)
		}
	}
	for t := range p.retained {
		if tool, ok := p.toolOf(t); ok && !tools[tool] {
			gone = append(gone, t)
		}
	}
	sort.Strings(gone)
	for _, t := range gone {
		delete(p.retained, t)
		p.removed[t] = true
		changes = append(changes, message{topic: t, payload: []byte{}, retained: true})
	}
	if len(changes) == 0 {
		return
	}
	p.changes = append(p.changes, changes...)
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// discovery is every discovery config of m, by topic (none with discovery
// off).
func (p *Publisher) discovery(m *manifest.Manifest) map[string][]byte {
	out := map[string][]byte{}
	if p.cfg.DiscoveryPrefix == "-" {
		return out
	}
	for _, c := range m.Capabilities {
		if c.Kind != manifest.KindRead {
			continue
		}
		if b, err := json.Marshal(p.sensor(m, c)); err == nil {
			out[p.DiscoveryTopic(c)] = b
		}
	}
	return out
}

// toolOf is the tool of a retained obs/, alarm/ or do/ topic.
func (p *Publisher) toolOf(topic string) (string, bool) {
	rest, ok := strings.CutPrefix(topic, p.base+"/")
	if !ok {
		return "", false
	}
	kind, rest, ok := strings.Cut(rest, "/")
	if !ok || kind != "obs" && kind != "alarm" && kind != "do" {
		return "", false
	}
	tool, _, _ := strings.Cut(rest, "/")
	return tool, tool != ""
}

func toolsOf(m *manifest.Manifest) map[string]bool {
	tools := map[string]bool{}
	for _, c := range m.Capabilities {
		tools[c.ToolName()] = true
	}
	return tools
}

// inForce reports whether topic belongs to the manifest in force: not the
// obs/, alarm/ or do/ topic of a tool it does not declare (p.mu held).
func (p *Publisher) inForce(topic string) bool {
	tool, ok := p.toolOf(topic)
	return !ok || p.tools[tool]
}
