#!/bin/sh
# The compile launcher (RULE_LAUNCH_COMPILE) of the compile checks of the programs a plain build
# leaves out (npullm_benchmarks_compile_check, npullm_demos_compile_check): runs the compile
# command it is given with -fsyntax-only, which parses and instantiates everything (so a program
# that no longer compiles fails the build) without optimizing or generating code, then creates
# the empty object the command names so the build tool sees it made. The compiler still writes
# the dependency file.
out=
prev=
for arg in "$@"; do
  [ "$prev" = "-o" ] && out=$arg
  prev=$arg
done
"$@" -fsyntax-only || exit $?
[ -n "$out" ] && : > "$out"
