package natscluster

import (
	"fmt"
	"strconv"
	"strings"
)

// block is a nats-server configuration block, its keys in order (the
// file reads like one an operator writes).
type block []kv

type kv struct {
	k string
	v any // string, int, bool, []string, block, []block
}

func (b block) String() string {
	var sb strings.Builder
	b.write(&sb, 0)
	return sb.String()
}

func (b block) write(sb *strings.Builder, depth int) {
	pad := strings.Repeat("  ", depth)
	for _, e := range b {
		sb.WriteString(pad + e.k + ": ")
		writeValue(sb, e.v, depth)
		sb.WriteString("\n")
	}
}

func writeValue(sb *strings.Builder, v any, depth int) {
	pad := strings.Repeat("  ", depth)
	switch x := v.(type) {
	case string:
		sb.WriteString(strconv.Quote(x))
	case int:
		sb.WriteString(strconv.Itoa(x))
	case bool:
		sb.WriteString(strconv.FormatBool(x))
	case []string:
		q := make([]string, len(x))
		for i, s := range x {
			q[i] = strconv.Quote(s)
		}
		sb.WriteString("[" + strings.Join(q, ", ") + "]")
	case block:
		sb.WriteString("{\n")
		x.write(sb, depth+1)
		sb.WriteString(pad + "}")
	case []block:
		sb.WriteString("[\n")
		for _, b := range x {
			sb.WriteString(pad + "  {\n")
			b.write(sb, depth+2)
			sb.WriteString(pad + "  }\n")
		}
		sb.WriteString(pad + "]")
	default:
		panic(fmt.Sprintf("natscluster: no configuration syntax for %T", v))
	}
}
