"""The embedded PostgreSQL 15 cluster: initdb, start on a free port, stop, status.

Used when HARTONOMOUS_DATABASE_URL is not set. As root, the server runs as an
unprivileged user (`postgres` when it exists, else a `hartonomous` system user).
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hartonomous.db.recovery import stop_orphaned_backends
from hartonomous.errors import UserError

DATABASE = "hartonomous"
SUPERUSER = "hartonomous"
EXTENSIONS = ("postgis", "vector")
PG_MAJOR = 15
_NOT_FOUND_HINT = (
    "PostgreSQL {major} binaries (initdb, pg_ctl, postgres) were not found. On Debian/Ubuntu run "
    "`make install-system` (or scripts/install-system-deps.sh); elsewhere set HARTONOMOUS_PG_BIN to "
    "their folder, or use an existing server: `docker compose up -d db` and "
    "HARTONOMOUS_DATABASE_URL=postgresql://hartonomous:hartonomous@localhost:5432/hartonomous"
)


def find_pg_bin(explicit: Path | None = None) -> Path:
    """Locate the folder holding PostgreSQL's server binaries."""
    if explicit:
        if all((Path(explicit) / exe).is_file() for exe in ("initdb", "pg_ctl", "postgres")):
            return Path(explicit)
        raise UserError(f"HARTONOMOUS_PG_BIN={explicit} does not hold PostgreSQL {PG_MAJOR} binaries "
                        "(initdb, pg_ctl, postgres); point it at their folder or unset it")
    candidates: list[Path] = []
    candidates.append(Path(f"/usr/lib/postgresql/{PG_MAJOR}/bin"))
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True)
            candidates.append(Path(out.stdout.strip()))
        except (OSError, subprocess.CalledProcessError):
            pass
    for name in ("postgres", "initdb"):
        found = shutil.which(name)
        if found:
            candidates.append(Path(found).resolve().parent)
    for cand in candidates:
        if all((cand / exe).is_file() for exe in ("initdb", "pg_ctl", "postgres")):
            return cand
    raise UserError(_NOT_FOUND_HINT.format(major=PG_MAJOR))


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ClusterState:
    """What we remember about a cluster between commands (port, credentials)."""

    port: int
    password: str
    reader_password: str

    @classmethod
    def load(cls, path: Path) -> "ClusterState | None":
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return cls(
            port=int(data["port"]),
            password=data["password"],
            reader_password=data.get("reader_password") or secrets.token_urlsafe(18),
        )

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.__dict__, indent=2))
        tmp.chmod(0o600)
        tmp.replace(path)


class EmbeddedCluster:
    """A PostgreSQL cluster owned by this project, under `data_dir`."""

    def __init__(self, data_dir: Path, pg_bin: Path | None = None, port: int | None = None,
                 conf: dict[str, str] | None = None, extensions: tuple[str, ...] = EXTENSIONS):
        """`conf` adds or overrides postgresql.conf settings at initdb; `extensions` are created in
        the database on every `up` (hartonomous/db/citus_cluster.py uses both for Citus nodes)."""
        self.requested_dir = Path(data_dir).expanduser().absolute()
        self._pg_bin = pg_bin
        self.requested_port = port
        self.conf = dict(conf or {})
        self.extensions = extensions
        self.state_file = self.requested_dir.parent / f"{self.requested_dir.name}.state.json"

    # -- locations and identity -------------------------------------------------
    @property
    def bin(self) -> Path:
        return find_pg_bin(self._pg_bin)

    @property
    def server_user(self) -> pwd.struct_passwd | None:
        """The account the server runs as; None when we are not root."""
        if os.geteuid() != 0:
            return None
        for name in ("postgres", "hartonomous"):
            try:
                return pwd.getpwnam(name)
            except KeyError:
                continue
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "hartonomous"],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam("hartonomous")

    @property
    def data_dir(self) -> Path:
        """The real data dir: the requested one, unless the server user cannot reach it."""
        user = self.server_user
        if user is None or _traversable_by(self.requested_dir.parent, user):
            return self.requested_dir
        digest = hashlib.sha1(str(self.requested_dir).encode()).hexdigest()[:12]
        return Path("/var/lib/hartonomous/clusters") / digest

    @property
    def log_file(self) -> Path:
        return self.data_dir / "server.log"

    @property
    def socket_dir(self) -> Path:
        return self.data_dir if len(str(self.data_dir)) < 80 else Path("/tmp")

    # -- running commands -------------------------------------------------------
    def _run(self, args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        user = self.server_user
        kwargs: dict = {"capture_output": True, "text": True}
        env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
        if user is not None:
            kwargs.update(user=user.pw_uid, group=user.pw_gid, extra_groups=[])
            env["HOME"] = "/tmp"
        proc = subprocess.run(args, env=env, cwd="/", **kwargs)
        if check and proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            raise UserError(f"{Path(args[0]).name} failed: {detail[-1] if detail else proc.returncode}")
        return proc

    # -- state ------------------------------------------------------------------
    def is_initialized(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def running_pid(self) -> int | None:
        """PID of our postmaster if it is alive; removes a stale postmaster.pid."""
        pid_file = self.data_dir / "postmaster.pid"
        try:
            lines = pid_file.read_text().splitlines()
        except (FileNotFoundError, PermissionError):
            return None
        try:
            pid = int(lines[0])
        except (IndexError, ValueError):
            pid = -1
        if pid > 0 and _is_postgres(pid):
            return pid
        pid_file.unlink(missing_ok=True)  # stale: the server died without cleaning up
        self._remove_stale_socket_locks()
        return None

    def _remove_stale_socket_locks(self) -> None:
        """Socket lock files of a dead (or zombie, not yet reaped) postmaster block a restart."""
        for lock in self.socket_dir.glob(".s.PGSQL.*.lock"):
            try:
                owner = int(lock.read_text().splitlines()[0])
            except (OSError, ValueError, IndexError):
                continue
            if not _is_postgres(owner):
                lock.unlink(missing_ok=True)
                Path(str(lock)[: -len(".lock")]).unlink(missing_ok=True)

    def running_port(self) -> int | None:
        if self.running_pid() is None:
            return None
        try:
            return int((self.data_dir / "postmaster.pid").read_text().splitlines()[3])
        except (FileNotFoundError, IndexError, ValueError):
            return None

    def state(self) -> ClusterState | None:
        return ClusterState.load(self.state_file)

    def url(self, role: str = "owner", driver: str = "postgresql") -> str:
        state = self.state()
        port = self.running_port()
        if state is None or port is None:
            raise UserError("the embedded database is not running; start it with `hartonomous db up`")
        if role == "reader":
            return f"{driver}://hartonomous_reader:{state.reader_password}@127.0.0.1:{port}/{DATABASE}"
        return f"{driver}://{SUPERUSER}:{state.password}@127.0.0.1:{port}/{DATABASE}"

    # -- lifecycle --------------------------------------------------------------
    def init(self) -> bool:
        """initdb once; returns True when a new cluster was created."""
        if self.is_initialized():
            return False
        data_dir = self.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        user = self.server_user
        if user is not None:
            os.chown(data_dir, user.pw_uid, user.pw_gid)
        data_dir.chmod(0o700)
        state = self.state() or ClusterState(port=0, password=secrets.token_urlsafe(18),
                                             reader_password=secrets.token_urlsafe(18))
        with tempfile.NamedTemporaryFile("w", delete=False, dir="/tmp") as pw:
            pw.write(state.password + "\n")
        try:
            if user is not None:
                os.chown(pw.name, user.pw_uid, user.pw_gid)
            self._run([
                str(self.bin / "initdb"), "-D", str(data_dir), "-U", SUPERUSER,
                "--auth=scram-sha-256", f"--pwfile={pw.name}", "-E", "UTF8", "--no-locale",
            ])
        finally:
            os.unlink(pw.name)
        conf = data_dir / "postgresql.conf"
        with conf.open("a") as fh:
            fh.write(
                "\n# hartonomous embedded cluster\n"
                "listen_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.socket_dir}'\n"
                "shared_buffers = 512MB\n"
                "max_connections = 100\n"
                "jit = off\n"
                "log_min_messages = warning\n"
                + "".join(f"{key} = {value}\n" for key, value in self.conf.items())
            )
        state.save(self.state_file)
        return True

    def _choose_port(self, state: ClusterState) -> int:
        if self.requested_port:
            if not port_is_free(self.requested_port):
                raise UserError(
                    f"port {self.requested_port} is already in use; set HARTONOMOUS_DB_PORT to a free "
                    "port or unset it to pick one automatically"
                )
            return self.requested_port
        if state.port and port_is_free(state.port):
            return state.port
        return free_port()

    def up(self) -> str:
        """Start the cluster if needed and ensure the database and extensions exist."""
        created = self.init()
        state = self.state()
        if state is None:
            raise UserError(
                f"cluster credentials are missing ({self.state_file}); remove {self.data_dir} "
                "and run `hartonomous db up` again"
            )
        if self.running_pid() is not None:
            self._ensure_database(state)
            return "already running"
        state.port = self._choose_port(state)
        state.save(self.state_file)
        for attempt in range(2):
            log_size = self.log_file.stat().st_size if self.log_file.exists() else 0
            proc = self._run([
                str(self.bin / "pg_ctl"), "-D", str(self.data_dir), "-w", "-t", "120",
                "-l", str(self.log_file), "-o", f"-p {state.port}", "start",
            ], check=False)
            # After a SIGKILLed server, a backend still running a query keeps the old shared
            # memory in use; stop it (hartonomous/db/recovery.py) and start once more.
            if proc.returncode == 0 or attempt or not stop_orphaned_backends(self.log_file, log_size):
                break
        if proc.returncode != 0:
            tail = _tail(self.log_file)
            raise UserError(f"the embedded database did not start: {tail or proc.stderr.strip()}")
        self._ensure_database(state)
        return "created and started" if created else "started"

    def down(self) -> str:
        if self.running_pid() is None:
            return "not running"
        self._run([str(self.bin / "pg_ctl"), "-D", str(self.data_dir), "-w", "-t", "120",
                   "-m", "fast", "stop"])
        return "stopped"

    def status(self) -> dict:
        pid = self.running_pid()
        return {
            "data_dir": str(self.data_dir),
            "initialized": self.is_initialized(),
            "running": pid is not None,
            "pid": pid,
            "port": self.running_port(),
        }

    def _ensure_database(self, state: ClusterState) -> None:
        import psycopg
        from psycopg import sql

        port = self.running_port()
        admin = f"postgresql://{SUPERUSER}:{state.password}@127.0.0.1:{port}/postgres"
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
                    exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                          (DATABASE,)).fetchone()
                    if not exists:
                        conn.execute(f'CREATE DATABASE "{DATABASE}"')
                break
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise UserError(f"the embedded database is not accepting connections: {exc}") from exc
                time.sleep(0.3)
        with psycopg.connect(self.url(), autocommit=True) as conn:
            if "citus" in self.extensions and conn.execute(
                    "SELECT 1 FROM pg_extension WHERE extname = 'citus'").fetchone():
                # A Citus node applies the role locally (a worker refuses to propagate it).
                conn.execute("SET citus.enable_ddl_propagation = off")
            # The least-privilege login used for inference; migrations grant what it may do.
            conn.execute(sql.SQL("""DO $$ BEGIN
                IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'hartonomous_reader') THEN
                    CREATE ROLE hartonomous_reader NOLOGIN;
                END IF; END $$"""))
            conn.execute(sql.SQL("ALTER ROLE hartonomous_reader LOGIN PASSWORD {}").format(
                sql.Literal(state.reader_password)))
            for ext in self.extensions:
                try:
                    conn.execute(f"CREATE EXTENSION IF NOT EXISTS {ext}")
                except psycopg.errors.UndefinedFile as exc:
                    raise UserError(
                        f"the PostgreSQL extension '{ext}' is not installed; run `make install-system`"
                        + (" (Citus: scripts/install-citus.sh, docs/scale-out.md)" if ext == "citus" else "")
                    ) from exc


def _is_postgres(pid: int) -> bool:
    """A live postgres process (a killed postmaster nobody has reaped yet is a zombie: dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state in ("Z", "X"):
            return False
        return Path(f"/proc/{pid}/comm").read_text().strip().startswith("postgres")
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


def _traversable_by(path: Path, user: pwd.struct_passwd) -> bool:
    """Whether `user` can reach `path` (execute permission on every ancestor)."""
    path = path.absolute()
    groups = {user.pw_gid}
    for ancestor in [path, *path.parents]:
        if not ancestor.exists():
            continue
        st = ancestor.stat()
        if st.st_uid == user.pw_uid:
            ok = st.st_mode & 0o100
        elif st.st_gid in groups:
            ok = st.st_mode & 0o010
        else:
            ok = st.st_mode & 0o001
        if not ok:
            return False
    return True


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])
