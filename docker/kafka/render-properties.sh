#!/bin/sh
# render-properties.sh FILE... > OUT
#
# Merges Java .properties files into one (a key in a later file replaces the value of the
# same key in an earlier file, keeping the earlier position) and fills ${NAME}
# placeholders from the environment. Fails, naming file, line and key, on a line that is
# not key=value or on a placeholder whose variable is unset or empty. Comments and blank
# lines are dropped. Only the subset of the .properties syntax that config/ uses is
# supported: one key=value per line, no line continuations or escapes.
set -eu
[ $# -gt 0 ] || { echo "usage: $0 FILE..." >&2; exit 64; }
for f in "$@"; do
  [ -r "$f" ] || { echo "$0: cannot read $f" >&2; exit 1; }
done
exec awk '
function fill(v,    out, start, len, name) {
  out = ""
  while ((start = index(v, "${")) > 0) {
    len = index(substr(v, start + 2), "}")
    if (len == 0) break
    name = substr(v, start + 2, len - 1)
    if (ENVIRON[name] == "") {
      printf "%s:%d: %s: no value for ${%s} (set %s in the environment)\n", FILENAME, FNR, key, name, name > "/dev/stderr"
      bad = 1
    }
    out = out substr(v, 1, start - 1) ENVIRON[name]
    v = substr(v, start + 2 + len)
  }
  return out v
}
/^[ \t]*([#!].*)?$/ { next }
{
  eq = index($0, "=")
  if (eq == 0) {
    printf "%s:%d: not a key=value line: %s\n", FILENAME, FNR, $0 > "/dev/stderr"
    bad = 1
    next
  }
  key = substr($0, 1, eq - 1); gsub(/^[ \t]+|[ \t]+$/, "", key)
  val = substr($0, eq + 1); gsub(/^[ \t]+|[ \t]+$/, "", val)
  if (!(key in value)) order[++n] = key
  value[key] = fill(val)
}
END {
  if (bad) exit 1
  for (i = 1; i <= n; i++) printf "%s=%s\n", order[i], value[order[i]]
}' "$@"
