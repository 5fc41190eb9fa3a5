/* Force-included after SMPI's smpi_helpers.h by bench/sim/build.sh: SMPI
   renames exit() with a one-argument macro, which breaks CLI11's
   App::exit(error, out, err); the bench leaves main normally, so the
   interception is not needed. */
#undef exit
