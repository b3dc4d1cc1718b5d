# ruff: noqa: F821
### dstat_gpu: `dstat --gpu` shows GPU utilisation, memory and gpumon's verdict (ok, STARV,
### SYNC, idle) beside dstat's CPU and disk columns.  Install it with `gpumon dstat install`,
### which fills in GPUMON_SITE_DIRS below: dstat runs under the system Python, which cannot
### see the environment gpumon is installed in.  The logic is gpumon.faces.dstat.columns.
###
### dstat exec()s this file inside its main(): top-level names are not visible from methods,
### so the class is built by gpumon and handed back with dstat's base class and globals.

GPUMON_SITE_DIRS = []  # written by `gpumon dstat install`


def _gpumon_plugin_class(base, host_globals, site_dirs, kind):
    import site
    import sys

    before = list(sys.path)
    for d in site_dirs:
        if d not in sys.path:
            site.addsitedir(d)  # also runs the .pth files of an editable install
    added = [p for p in sys.path if p not in before]
    sys.path[:] = added + before  # gpumon's environment first: its pynvml, not a distro's
    try:
        from gpumon.faces.dstat.columns import plugin_class
    except ImportError as exc:
        raise Exception(
            f"gpumon cannot be imported by {sys.executable} ({exc}); run "
            "`gpumon dstat install` from the environment gpumon is installed in"
        ) from None
    return plugin_class(base, host_globals, kind)


dstat_plugin = _gpumon_plugin_class(dstat, globals(), GPUMON_SITE_DIRS, "dstat")
