package gate

import (
	"regexp"
	"strings"
)

// The L0 shell blacklist. It is physd's own table, written from the rule
// categories documented in the phocinae notes A4, kept outside the repository (no upstream regex is
// copied). Every string argument, argument key and the tool name are checked
// against it; a hit is deny at L0 and can never be overridden.
//
// Matching is RE2, case-insensitive, "anywhere in the string", on up to three
// variants of the input: as given, with whitespace collapsed, and with shell
// quoting removed (quotes and backslashes dropped, $IFS / ${IFS} read as a
// space), so r''m -rf "/" is caught like rm -rf /.
//
// Bare power words (halt, reboot, shutdown, poweroff) are matched in command
// position, so a string argument that is exactly "halt" is denied; an
// actuator whose enum needs such a word must spell it differently
// (halted, stop, ...).

// ShellRule is one named blacklist entry.
type ShellRule struct {
	Name string
	Note string
	re   *regexp.Regexp
	kw   uint64 // prefilter: bits of allKeywords; the regexp can only match if one occurs
}

// Regexp returns the compiled expression.
func (r ShellRule) Regexp() *regexp.Regexp { return r.re }

// Building blocks.
const (
	// command position: start, after an operator, a quote, a brace or a path
	// separator — but not after '-' (docker --rm) or a word character.
	cp = `(?:^|[\s;&|()\x60{}'"/])`
	// system directories.
	sys = `(?:etc|usr|var|boot|bin|sbin|lib|lib32|lib64|libx32|opt|root|srv|sys|proc)`
	// a path token ends here.
	end = `(?:\s|$|[;&|)\x60])`
	// one command's arguments (do not cross an operator).
	args = `[^;&|\n]*?`
	// shells.
	shells = `(?:ba|da|k|z|c|tc|fi|a|mk|y|pd|r)?sh`
	// downloaders.
	dl = `(?:curl|wget|fetch|lynx|w3m|aria2c|links|elinks|httpie|https?)`
	// interpreters that execute piped code.
	interp = `(?:` + shells + `|python[0-9.]*|perl|ruby|node|php[0-9]*|lua|bun|deno|tclsh|osascript)`
	// block devices.
	blk = `/dev/(?:sd|hd|vd|xvd|nvme|mmcblk|dm-|md|loop|disk|rdisk|mapper/|sr|ram|zram|ubi|mtd)`
)

var shellRules = compileShell([][3]string{
	{"rm_root", "rm of the root directory or a top-level directory (/, /*, /home, /tmp, ...)",
		cp + `rm\s+(?:\S+\s+)*?(?:/+\.{0,2})+(?:[^/\s;&|)\x60]+(?:/+\.{0,2})*)?\*?` + end},
	{"rm_home", "rm of the home directory (~, $HOME)",
		cp + `rm\s+(?:\S+\s+)*?(?:~|\$HOME|\$\{HOME\})(?:/+\.{0,2})*\*?` + end},
	{"rm_system_dir", "rm inside a system directory",
		cp + `rm\s+(?:\S+\s+)*?/+` + sys + `(?:/|\*|` + end + `)`},
	{"rm_cwd_parent", "rm of the current or parent directory (. .. *)",
		cp + `rm\s+(?:\S+\s+)*?(?:\.{1,2}(?:/+\.{0,2})*\*?|\*)` + end},
	{"sudo_destroyer", "sudo/doas with a destructive command",
		`\b(?:sudo|doas)\b(?:\s+\S+)*?\s+(?:\S*/)?(?:rm|dd|shred|mkfs(?:\.\w+)?|mke2fs|fdisk|sfdisk|cfdisk|gdisk|sgdisk|parted|wipefs|blkdiscard|shutdown|reboot|poweroff|halt|init\s+[06]|kill\s+-9\s+-?1\b)(?:\s|$|;|&|\|)`},
	{"download_exec", "download piped into an interpreter",
		`\b` + dl + `\b[^\n]*?\|\s*(?:sudo\s+(?:-\S+\s+)*)?(?:env\s+(?:\S+\s+)*?)?(?:\S*/)?` + interp + `\b`},
	{"pipe_to_shell", "output piped into a shell",
		`\|\s*(?:sudo\s+(?:-\S+\s+)*)?(?:env\s+(?:\S+\s+)*?)?(?:\S*/)?` + shells + `(?:\s|$|[;&|)\x60])`},
	{"shell_c_download", "shell -c running a download",
		`\b` + shells + `\s+(?:-\w+\s+)*-\w*c\w*\s+[^\n]*?\b` + dl + `\b`},
	{"eval_download", "eval of downloaded code",
		`\beval\b[^\n]*?(?:\$\(|\x60|<\()\s*(?:\S*/)?` + dl + `\b`},
	{"source_download", "source/. or a shell reading a download through <(...)",
		`(?:\bsource|(?:^|[\s;&|(])\.|\b` + shells + `)\s+(?:-\S+\s+)*<\(\s*(?:\S*/)?` + dl + `\b`},
	{"subst_download", "command substitution of a download $(curl ...)",
		`(?:\$\(|\x60)\s*(?:\S*/)?` + dl + `\b`},
	{"git_force_push", "git push --force / -f / +refspec",
		`\bgit\b` + args + `\spush\b` + args + `\s(?:--force(?:\s|$|=)|-[a-z]*f[a-z]*(?:\s|$)|\+\S+)`},
	{"git_push_delete", "git push --delete / -d / :branch",
		`\bgit\b` + args + `\spush\b` + args + `\s(?:--delete\b|-[a-z]*d[a-z]*(?:\s|$)|:\S+)`},
	{"find_delete_system", "find over /, a top-level or system directory or ~ with -delete",
		`\bfind\s+(?:-\S+\s+)*(?:\S+\s+)*?(?:/+(?:[^/\s]+/*)?|/+` + sys + `\S*|~/*|\$HOME/*)\s` + args + `-delete\b`},
	{"find_exec_rm", "find -exec rm",
		`\bfind\b` + args + `\s-(?:exec|execdir|ok|okdir)\s+(?:\S*/)?(?:rm|shred|unlink)\b`},
	{"xargs_rm", "xargs rm",
		`\bxargs\b` + args + `\s(?:\S*/)?(?:rm|shred|unlink)\b`},
	{"dd_block_device", "dd writing to a block device",
		`\bdd\b` + args + `\bof=` + blk},
	{"mkfs", "making a filesystem (mkfs*, mke2fs, mkswap)",
		cp + `(?:mkfs(?:\.\w+)?|mke2fs|mkswap|mkdosfs|newfs)\b`},
	{"partition_edit", "partition table editors (fdisk, sfdisk, parted, ...)",
		cp + `(?:fdisk|sfdisk|cfdisk|gdisk|sgdisk|parted)\b`},
	{"wipe_device", "wiping a device (wipefs, blkdiscard, shred or cat onto /dev)",
		cp + `(?:wipefs|blkdiscard)\b|\bshred\b` + args + blk + `|>\s*` + blk},
	{"chmod_world", "chmod 77x / a+rwx",
		`\bchmod\b` + args + `\s(?:[0-7]?77[0-7]|(?:a|ugo|o)\+[rwx]*w[rwx]*)` + end},
	{"chown_system", "chown/chgrp onto / or a system path",
		`\bch(?:own|grp)\b` + args + `\s/+(?:` + sys + `)?(?:/|\*|` + end + `)`},
	{"fork_bomb", "fork bomb",
		`[\w:.]+\s*\(\s*\)\s*\{\s*[\w:.]+\s*\|\s*[\w:.]+\s*&|%0\s*\|\s*%0`},
	{"power_off", "shutdown / reboot / poweroff / halt",
		`(?:^|[;&|(){}\x60\n]|\$\(|\b(?:exec|nohup|systemctl(?:\s+-\S+)*)\s+)\s*(?:/\S*/)?(?:shutdown|reboot|poweroff|halt|kexec)(?:\s|$|[;&|)\x60])|` + cp + `(?:tel)?init\s+[06]` + end},
	{"crontab_remove", "crontab -r",
		`\bcrontab\b` + args + `\s-[a-z]*r\b`},
	{"redirect_system", "> / >> / tee into a system directory or shell startup file",
		`(?:>{1,2}\|?|\btee\s+(?:-\S+\s+)*)\s*(?:/+` + sys + `(?:/|` + end + `)|(?:~|\$HOME|\$\{HOME\})/\.(?:bashrc|bash_profile|bash_login|profile|zshrc|zprofile|ssh/))`},
	{"mv_system", "mv into or out of a system directory (or onto /dev/null)",
		`\bmv\b` + args + `\s/+(?:` + sys + `(?:/|` + end + `)|dev/null\b|` + end + `)`},
})

// prefilter keywords per rule (lower case). A keyword starting with '^'
// must sit at a word start (start of string or after a byte that is not
// [a-z0-9_]). Each list is a superset condition of its regexp: a string
// without any keyword cannot match, so the regexp is skipped (see
// foldLower for the case folding).
var shellKeywords = map[string][]string{
	"rm_root": {"^rm"}, "rm_home": {"^rm"}, "rm_system_dir": {"^rm"}, "rm_cwd_parent": {"^rm"},
	"sudo_destroyer":     {"^sudo", "^doas"},
	"download_exec":      {"|"},
	"pipe_to_shell":      {"|"},
	"shell_c_download":   {"curl", "wget", "fetch", "lynx", "w3m", "aria2c", "links", "http"},
	"eval_download":      {"^eval"},
	"source_download":    {"<("},
	"subst_download":     {"$(", "`"},
	"git_force_push":     {"^push"},
	"git_push_delete":    {"^push"},
	"find_delete_system": {"-delete"},
	"find_exec_rm":       {"-exec", "-ok"},
	"xargs_rm":           {"^xargs"},
	"dd_block_device":    {"of=/dev/"},
	"mkfs":               {"mkfs", "mke2fs", "mkswap", "mkdosfs", "newfs"},
	"partition_edit":     {"disk", "parted"},
	"wipe_device":        {"wipefs", "blkdiscard", "/dev/"},
	"chmod_world":        {"^chmod"},
	"chown_system":       {"^chown", "^chgrp"},
	"fork_bomb":          {"{", "%0"},
	"power_off":          {"shutdown", "reboot", "poweroff", "halt", "kexec", "init"},
	"crontab_remove":     {"^crontab"},
	"redirect_system":    {">", "tee"},
	"mv_system":          {"^mv"},
}

// allKeywords is the distinct keyword list; a rule's kw holds bit i for
// allKeywords[i].
var allKeywords []string

func compileShell(rows [][3]string) []ShellRule {
	index := map[string]int{}
	out := make([]ShellRule, len(rows))
	for i, r := range rows {
		kws, ok := shellKeywords[r[0]]
		if !ok {
			panic("gate: no prefilter keywords for shell rule " + r[0])
		}
		var mask uint64
		for _, k := range kws {
			j, ok := index[k]
			if !ok {
				j = len(allKeywords)
				index[k] = j
				allKeywords = append(allKeywords, k)
			}
			mask |= 1 << j
		}
		out[i] = ShellRule{Name: r[0], Note: r[1], re: regexp.MustCompile(`(?i)` + r[2]), kw: mask}
	}
	if len(allKeywords) > 64 {
		panic("gate: too many prefilter keywords")
	}
	return out
}

// keywordsIn returns the bits of allKeywords present in lower (the
// lower-cased ASCII input).
func keywordsIn(lower string) uint64 {
	var m uint64
	for j, k := range allKeywords {
		if k[0] != '^' {
			if strings.Contains(lower, k) {
				m |= 1 << j
			}
			continue
		}
		k = k[1:]
		for off := 0; ; {
			i := strings.Index(lower[off:], k)
			if i < 0 {
				break
			}
			i += off
			if i == 0 || !isWordByte(lower[i-1]) {
				m |= 1 << j
				break
			}
			off = i + 1
		}
	}
	return m
}

func isWordByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_'
}

// foldLower lower-cases s for the prefilter. (?i) in RE2 folds two
// non-ASCII letters onto ASCII ones: U+017F (long s) and U+212A (Kelvin
// sign); strings.ToLower already maps U+212A to k, so only U+017F needs
// mapping. Other non-ASCII characters cannot match an ASCII keyword.
func foldLower(s string) string {
	if isASCII(s) {
		return strings.ToLower(s)
	}
	return strings.ToLower(strings.ReplaceAll(s, "\u017f", "s"))
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// ShellRules returns the built-in blacklist, in match order.
func ShellRules() []ShellRule { return append([]ShellRule(nil), shellRules...) }

// MatchShell reports the first blacklist rule matching s (or any of its
// normalised variants).
func MatchShell(s string) (ShellRule, bool) {
	if s == "" {
		return ShellRule{}, false
	}
	for _, v := range shellVariants(s) {
		present := keywordsIn(foldLower(v))
		if present == 0 {
			continue
		}
		for i := range shellRules {
			r := &shellRules[i]
			if r.kw&present == 0 {
				continue
			}
			if r.re.MatchString(v) {
				return *r, true
			}
		}
	}
	return ShellRule{}, false
}

// shellVariants returns s, s with whitespace collapsed, and s with shell
// quoting removed; duplicates are dropped.
func shellVariants(s string) []string {
	out := []string{s}
	c := s
	if needsCollapse(s) {
		c = strings.Join(strings.Fields(s), " ")
		out = append(out, c)
	}
	if strings.ContainsAny(s, "'\"\\$") {
		u := strings.NewReplacer("${IFS}", " ", "$IFS", " ", "'", "", `"`, "", `\`, "").Replace(s)
		u = strings.Join(strings.Fields(u), " ")
		if u != c && u != s {
			out = append(out, u)
		}
	}
	return out
}

// shellOperators are the characters that make a string a possible shell
// pipeline; such a string is never allowed by an L0 allow rule.
const shellOperators = ";&|`><\n\r\x00"

// hasShellOperator reports whether s contains ; & | ` > < newline or $( .
func hasShellOperator(s string) bool {
	return strings.ContainsAny(s, shellOperators) || strings.Contains(s, "$(")
}

// needsCollapse reports whether s has whitespace other than single spaces
// between non-space characters.
func needsCollapse(s string) bool {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\t', '\n', '\v', '\f', '\r', 0x85, 0xA0:
			return true
		case ' ':
			if i == 0 || i == len(s)-1 || s[i+1] == ' ' {
				return true
			}
		}
		if s[i] >= 0x80 {
			return true // unicode spaces: let strings.Fields decide
		}
	}
	return false
}
