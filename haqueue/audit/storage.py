"""The audit's paths on any file system Spark's Hadoop layer reads (`file://`, `hdfs://`, `s3a://` where
its jars are, ...), through the session's JVM: what is there, the event files and their size, and
writing the report. A plain path is a path on the driver's machine (`file://`), whatever the
cluster's default file system; the executors must see it at the same path."""
from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pyspark.sql import SparkSession

from haqueue.audit.exits import UsageError

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/")


def uri(location: str) -> str:
    """`location` as a URI: a plain path becomes an absolute `file://` one."""
    return location if _SCHEME.match(location) else "file://" + os.path.abspath(location)


def local_path(location: str) -> str | None:
    """The driver's path of a plain path or a `file:` URI; None on another file system."""
    if not _SCHEME.match(location):
        return location
    return urllib.parse.urlparse(location).path if location.startswith("file:/") else None


def check_paths(events: str, ledgers: Sequence[str], out: str, storage: Storage | None) -> None:
    """UsageError naming an input that is not there, or an --out that is a file: without `storage`, of the paths
    on the driver's file system (plain, file://), asked before Spark starts (a JVM takes seconds to start); with
    it, of the others, asked of Hadoop's file systems."""
    def asked(location: str) -> bool:
        return (local_path(location) is None) == (storage is not None)

    is_dir, is_file = (storage.is_dir, storage.is_file) if storage else (_local(os.path.isdir), _local(os.path.isfile))
    if asked(events) and not is_dir(events):
        raise UsageError(f"no such directory: {events}")
    absent = [path for path in ledgers if asked(path) and not is_file(path)]
    if absent:
        raise UsageError(f"no such ledger file: {', '.join(absent)}")
    if asked(out) and is_file(out):
        raise UsageError(f"--out is a file, not a directory: {out}")


def _local(test: Callable[[str], bool]) -> Callable[[str], bool]:
    return lambda location: test(local_path(location) or location)


class Storage:
    """The Hadoop file systems of a Spark session."""

    def __init__(self, spark: SparkSession) -> None:
        self.jvm: Any = spark.sparkContext._jvm
        self.conf = spark.sparkContext._jsc.hadoopConfiguration()

    def _open(self, location: str) -> tuple[Any, Any]:
        """(file system, Hadoop Path) of `location`; UsageError if no file system serves its scheme."""
        path = self.jvm.org.apache.hadoop.fs.Path(uri(location))
        try:
            return path.getFileSystem(self.conf), path
        except Exception as e:  # py4j's error: UnsupportedFileSystemException, a class not found...
            cause = getattr(e, "java_exception", None)
            what = str(cause.toString() if cause is not None else e).splitlines()[0]
            raise UsageError(f"cannot reach {location}: {what} ({self._hint(location)})") from None

    def _hint(self, location: str) -> str:
        """What to look at when no file system serves `location`. A URI without a host (hdfs:///audit) is
        resolved against fs.defaultFS, which names the host when it is of the same scheme; otherwise Hadoop
        finds no host and says so, whatever its classpath."""
        parsed = urllib.parse.urlparse(location)
        if not parsed.netloc:
            default = self.conf.get("fs.defaultFS")
            return (f"the URI names no host, and the default file system, fs.defaultFS, is {default}: write "
                    f"{parsed.scheme}://HOST{parsed.path} (for hdfs the namenode), or set fs.defaultFS "
                    "(core-site.xml in HADOOP_CONF_DIR, or --conf spark.hadoop.fs.defaultFS=...)")
        return "is the file system's client on Spark's classpath, e.g. hadoop-aws for s3a?"

    def is_dir(self, location: str) -> bool:
        fs, path = self._open(location)
        return bool(fs.exists(path) and fs.getFileStatus(path).isDirectory())

    def is_file(self, location: str) -> bool:
        fs, path = self._open(location)
        return bool(fs.exists(path) and fs.getFileStatus(path).isFile())

    def write(self, directory: str, files: Iterable[tuple[str, bytes]]) -> None:
        """Each (name, bytes) as the file `name` in `directory`, made if missing; replaced if there."""
        local = local_path(directory)
        if local is not None:  # plain files, not Hadoop's local file system (a .crc file beside each)
            os.makedirs(local, exist_ok=True)
            for name, data in files:
                with open(os.path.join(local, name), "wb") as f:
                    f.write(data)
            return
        fs, path = self._open(directory)
        fs.mkdirs(path)
        for name, data in files:
            stream = fs.create(self.jvm.org.apache.hadoop.fs.Path(path, name), True)
            try:
                stream.write(bytearray(data))  # Py4J passes a bytearray as a Java byte[]
            finally:
                stream.close()
