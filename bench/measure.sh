# Process measures shared by the benchmark scripts (sourced, not run): a process tree's CPU
# seconds and peak memory from /proc, wall-clock times, and text made safe for JSON.

clk_tck=$(getconf CLK_TCK)

# descendants PID: every descendant's pid, depth first.
descendants() {
  local child
  for child in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
    echo "$child"
    descendants "$child"
  done
}
# tree_cpu PID: CPU seconds (user+sys, reaped children included) of PID and its live descendants.
tree_cpu() {
  local pid ticks=0 stat fields
  for pid in "$1" $(descendants "$1"); do
    { read -r stat <"/proc/$pid/stat"; } 2>/dev/null || continue
    read -ra fields <<<"${stat##*) }"
    ticks=$((ticks + fields[11] + fields[12] + fields[13] + fields[14]))
  done
  awk "BEGIN{printf \"%.2f\", $ticks / $clk_tck}"
}
# tree_rss_kb PID: the sum of VmHWM (peak RSS) of PID and its live descendants.
tree_rss_kb() {
  local pid total=0 hwm
  for pid in "$1" $(descendants "$1"); do
    hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    total=$((total + ${hwm:-0}))
  done
  echo "$total"
}
now() { date +%s.%N; }
# elapsed START: seconds since START (a `now`), two decimals.
elapsed() { awk "BEGIN{printf \"%.2f\", $(now) - $1}"; }
# sub A B: A - B, two decimals.
sub() { awk "BEGIN{printf \"%.2f\", $1 - $2}"; }
# json_str TEXT: TEXT as one line without quotes, backslashes or colours, 200 characters at most.
json_str() { tr -d '"\\' <<<"$1" | tr '\n' ' ' | sed 's/\x1b\[[0-9;]*m//g; s/ *$//' | cut -c1-200; }
