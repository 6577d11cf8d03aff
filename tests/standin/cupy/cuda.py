"""``cupy.cuda`` of the stand-in: one pretend device; synchronisation is a no-op, events read the
host clock. Only the names refbayes and its device check use are modelled."""
import time as _time


class _Runtime:
    @staticmethod
    def getDeviceCount():
        return 1

    @staticmethod
    def getDeviceProperties(device):
        return {"name": b"CuPy stand-in (NumPy on the CPU)", "totalGlobalMem": 0,
                "major": 0, "minor": 0, "multiProcessorCount": 0}

    @staticmethod
    def runtimeGetVersion():
        return 0

    @staticmethod
    def driverGetVersion():
        return 0


runtime = _Runtime()


class Device:
    def __init__(self, device=0):
        self.id = int(device)
        self.compute_capability = "00"

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class Stream:
    null = None

    def synchronize(self):
        pass


Stream.null = Stream()


def get_current_stream():
    return Stream.null


class Event:
    def __init__(self, *args, **kwargs):
        self._t = None

    def record(self, stream=None):
        self._t = _time.perf_counter()

    def synchronize(self):
        pass


def get_elapsed_time(start, end):
    """Milliseconds between two recorded events (host clock in the stand-in)."""
    return (end._t - start._t) * 1e3


def is_available():
    return True
