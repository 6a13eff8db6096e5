package e2e

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// A minimal Chrome DevTools Protocol client over --remote-debugging-pipe
// (the browser reads commands on fd 3 and writes answers on fd 4, each
// message JSON ended by a NUL byte): no WebSocket, no dependency. It
// drives one page of Debian's headless chromium.

type cdpMsg struct {
	ID        int             `json:"id,omitempty"`
	Method    string          `json:"method,omitempty"`
	Params    any             `json:"params,omitempty"`
	SessionID string          `json:"sessionId,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     *struct {
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

type browserPage struct {
	t       *testing.T
	cmd     *exec.Cmd
	out     *os.File
	mu      sync.Mutex
	next    int
	waiting map[int]chan cdpMsg
	session string
}

// openBrowser starts chromium and opens one blank page.
func openBrowser(t *testing.T) *browserPage {
	t.Helper()
	bin := chromium(t)
	toBrowser, ourEnd, err := os.Pipe() // chromium reads fd 3
	if err != nil {
		t.Fatal(err)
	}
	fromBrowser, theirEnd, err := os.Pipe() // chromium writes fd 4
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--hide-scrollbars",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--mute-audio",
		"--force-device-scale-factor=1", "--remote-debugging-pipe", "--user-data-dir="+t.TempDir(), "about:blank")
	cmd.ExtraFiles = []*os.File{toBrowser, theirEnd}
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	toBrowser.Close()
	theirEnd.Close()
	p := &browserPage{t: t, cmd: cmd, out: ourEnd, waiting: map[int]chan cdpMsg{}}
	go p.read(fromBrowser)
	t.Cleanup(func() {
		ourEnd.Close()
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("chromium stderr:\n%s", stderr.String())
		}
	})
	var target struct {
		TargetID string `json:"targetId"`
	}
	p.call("Target.createTarget", map[string]any{"url": "about:blank"}, &target)
	var att struct {
		SessionID string `json:"sessionId"`
	}
	p.call("Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &att)
	p.session = att.SessionID
	p.call("Page.enable", nil, nil)
	p.call("Runtime.enable", nil, nil)
	return p
}

// read delivers answers to their callers; events are not used.
func (p *browserPage) read(f *os.File) {
	r := bufio.NewReader(f)
	for {
		raw, err := r.ReadBytes(0)
		if err != nil {
			return
		}
		var m cdpMsg
		if json.Unmarshal(raw[:len(raw)-1], &m) != nil || m.ID == 0 {
			continue
		}
		p.mu.Lock()
		ch := p.waiting[m.ID]
		delete(p.waiting, m.ID)
		p.mu.Unlock()
		if ch != nil {
			ch <- m
		}
	}
}

// call sends one command (to the page once attached) and decodes its
// result into out.
func (p *browserPage) call(method string, params any, out any) {
	p.t.Helper()
	p.mu.Lock()
	p.next++
	id := p.next
	ch := make(chan cdpMsg, 1)
	p.waiting[id] = ch
	p.mu.Unlock()
	b, _ := json.Marshal(cdpMsg{ID: id, Method: method, Params: params, SessionID: p.session})
	if _, err := p.out.Write(append(b, 0)); err != nil {
		p.t.Fatalf("%s: %v", method, err)
	}
	select {
	case m := <-ch:
		if m.Error != nil {
			p.t.Fatalf("%s: %s", method, m.Error.Message)
		}
		if out != nil {
			if err := json.Unmarshal(m.Result, out); err != nil {
				p.t.Fatalf("%s: %v: %s", method, err, m.Result)
			}
		}
	case <-time.After(30 * time.Second):
		p.t.Fatalf("%s: chromium did not answer in 30 s", method)
	}
}

// eval runs a JavaScript expression in the page (awaiting a promise) and
// decodes its value into out.
func (p *browserPage) eval(expr string, out any) {
	p.t.Helper()
	var res struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		Exception *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	p.call("Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true, "awaitPromise": true}, &res)
	if res.Exception != nil {
		p.t.Fatalf("eval %s: %s %s", expr, res.Exception.Text, res.Exception.Exception.Description)
	}
	if out != nil && len(res.Result.Value) > 0 {
		if err := json.Unmarshal(res.Result.Value, out); err != nil {
			p.t.Fatalf("eval %s: %v: %s", expr, err, res.Result.Value)
		}
	}
}

func (p *browserPage) str(expr string) string {
	p.t.Helper()
	var s string
	p.eval(expr, &s)
	return s
}

// until polls a boolean expression until it holds or d ends; it returns
// how long that took.
func (p *browserPage) until(what, expr string, d time.Duration) time.Duration {
	p.t.Helper()
	start := time.Now()
	for {
		var ok bool
		p.eval(expr, &ok)
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > d {
			p.t.Fatalf("%s: not within %v (%s); page at %s:\n%.3000s", what, d, expr, p.str("location.href"), p.str("document.body ? document.body.innerText : ''"))
		}
		time.Sleep(25 * time.Millisecond) // a poll of the page's state, not a wait for time to pass
	}
}

// navigate loads url and waits for the load to end.
func (p *browserPage) navigate(url string) {
	p.t.Helper()
	p.eval(`window.__nav = 1`, nil)
	p.call("Page.navigate", map[string]any{"url": url}, nil)
	p.loaded()
}

// loaded waits for the document that replaced the one marked __nav.
func (p *browserPage) loaded() {
	p.t.Helper()
	p.until("page load", `window.__nav === undefined && document.readyState === 'complete'`, 15*time.Second)
}

// typeInto focuses the field and types text as keystrokes would.
func (p *browserPage) typeInto(selector, text string) {
	p.t.Helper()
	p.eval(fmt.Sprintf(`(() => { const e = document.querySelector(%q); e.value = ''; e.focus(); return true })()`, selector), nil)
	p.call("Input.insertText", map[string]any{"text": text}, nil)
}

// press sends one key (Enter submits the focused form).
func (p *browserPage) press(key string, code int) {
	p.t.Helper()
	text := ""
	if key == "Enter" {
		text = "\r"
	}
	p.call("Input.dispatchKeyEvent", map[string]any{"type": "keyDown", "key": key, "code": key, "windowsVirtualKeyCode": code, "text": text}, nil)
	p.call("Input.dispatchKeyEvent", map[string]any{"type": "keyUp", "key": key, "code": key, "windowsVirtualKeyCode": code}, nil)
}

// submitWith focuses a button and presses Enter on it (the keyboard way),
// then waits for the page the form leads to.
func (p *browserPage) submitWith(selector string) {
	p.t.Helper()
	p.eval(`window.__nav = 1`, nil)
	var ok bool
	p.eval(fmt.Sprintf(`(() => { const e = document.querySelector(%q); if (!e) return false; e.focus(); return document.activeElement === e })()`, selector), &ok)
	if !ok {
		p.t.Fatalf("no focusable %s on %s:\n%.3000s", selector, p.str("location.href"), p.str("document.body.innerText"))
	}
	p.press("Enter", 13)
	p.loaded()
}

// screenshot saves the whole page at width CSS pixels as a PNG.
func (p *browserPage) screenshot(path string, width int) {
	p.t.Helper()
	p.call("Emulation.setDeviceMetricsOverride", map[string]any{"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": width < 600}, nil)
	var h float64
	p.eval(`new Promise(r => requestAnimationFrame(() => r(document.documentElement.scrollHeight)))`, &h)
	p.call("Emulation.setDeviceMetricsOverride", map[string]any{"width": width, "height": int(h), "deviceScaleFactor": 1, "mobile": width < 600}, nil)
	var shot struct {
		Data string `json:"data"`
	}
	p.call("Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": true}, &shot)
	b, err := base64.StdEncoding.DecodeString(shot.Data)
	if err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		p.t.Fatal(err)
	}
	p.call("Emulation.clearDeviceMetricsOverride", nil, nil)
}

// text is the page's visible text.
func (p *browserPage) text() string { return p.str(`document.body.innerText`) }

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return strings.ReplaceAll(string(b), "</", "<\\/")
}
