"""Process limits the server sets for itself at start."""

from __future__ import annotations

import logging

log = logging.getLogger("rtserver.server")


def raise_fd_limit(wanted: int) -> tuple[int, int]:
    """Raise this process's soft limit on open files toward ``wanted`` (never
    above the hard limit, never lower than it was); log and return
    ``(soft limit before, soft limit now)``. Each connection holds one
    descriptor, so the common soft limit of 1,024 caps a server near 1,000
    connections whatever ``max_connections`` says."""
    try:
        import resource
    except ImportError:  # not POSIX
        return (0, 0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("open files: could not raise the limit from %d to %d: %s",
                        soft, target, exc)
            return (soft, soft)
        log.info("open files: soft limit raised from %d to %d (hard %s)", soft, target,
                 "unlimited" if hard == resource.RLIM_INFINITY else hard)
        new = target
    else:
        new = soft
        log.info("open files: soft limit %d (%d wanted)", soft, wanted)
    if new < wanted:
        log.warning("open files: limit %d is below the %d wanted (max_connections + "
                    "fd_margin); raise the hard limit (ulimit -Hn) to hold that many "
                    "connections", new, wanted)
    return (soft, new)


__all__ = ["raise_fd_limit"]
