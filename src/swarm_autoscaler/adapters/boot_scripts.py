"""The user data the daemon gives its machines: boot script, wait for dockerd, join, and a failed boot
that says why.

Every launch runs `render_user_data`: the type's boot script, then a wait for dockerd (bounded), then the
swarm join, retried (bounded). A boot that cannot finish (the boot script fails, dockerd never answers,
every join attempt fails) writes one line beginning with `BOOT_FAILED_LINE` to standard error, which
cloud-init copies to the instance's console (EC2 GetConsoleOutput, `aws ec2 get-console-output`) and to
/var/log/cloud-init-output.log, then shuts the machine down. RunInstances leaves
InstanceInitiatedShutdownBehavior at `stop`, so the machine stops: the daemon lists an owned machine
launched to join that stopped by itself (`ec2_support.stopped_by_itself`), backs its (type, subnet) off as
if EC2 had refused it, and terminates it as "stopped outside the warm pool" on the same tick, instead of
waiting `max_start_time` and relaunching the same failing type for ever.

Join tickets (`AUTOSCALER_EC2_JOIN_URL` set: `render_ticket_user_data`, `render_ticket_start_user_data`):
the join step first asks the daemon's join endpoint for the token with a ticket, from the machine's own
private IP, over TLS checked against the pin of the endpoint's key (`ticket_join`, `adapters.join_tickets`,
`adapters.join_tls`): an endpoint with another key gets nothing sent; a refused ticket fails that attempt like a failed
join, so after `JOIN_ATTEMPTS` the boot fails and says so, as above. The token is never in user data.
Once joined, the machine confirms its node id (`docker info`) the same way, with the same ticket
(`daemon.join`): the daemon labels that node with the instance's id and adopts only so labelled nodes
(`Policy.adopt_by_identity`); a confirmation that fails fails the attempt too (a joined node skips the
fetch and the join on the next attempt, and confirms again).

Warm pool: the first boot (`render_pool_user_data`) ends in a shutdown by design, so its failure cannot
be a shutdown too: it writes the console line and keeps running, and the daemon terminates it as broken
after `max_start_time`. A start (`render_start_user_data`) waits for dockerd and retries its join the same
way and writes the console line on failure, without stopping (a stopped pool machine is a pool member).

The scripts are POSIX sh (a boot script with its own `#!/bin/sh` keeps working); they need `docker` and
`shutdown`, which every AMI the deployment guide lists has. `check_user_data` refuses, at start-up, a type
whose rendered user data is over EC2's 16 KiB.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence

from swarm_autoscaler.adapters.join_tickets import TICKET
from swarm_autoscaler.errors import ConfigurationError

USER_DATA_LIMIT = 16 * 1024  # EC2's limit on raw user data, before base64

# The last line of a warm-pool machine's first boot: the boot script has run (images pulled), so the
# machine stops itself (RunInstances sets InstanceInitiatedShutdownBehavior=stop). The machine
# emulator recognises it too.
POOL_STOP_LINE = "shutdown -h now"
# How a failed boot starts its console line (operators grep the console output for it).
BOOT_FAILED_LINE = "swarm-autoscaler: boot failed:"
DOCKERD_WAIT_S = 300  # dockerd starts within seconds on the listed AMIs; a slow first boot pulls nothing yet
JOIN_ATTEMPTS = 5  # spaced 5, 10, 15, 20 s apart: a manager mid-election answers again within that
_MIME_BOUNDARY = "==swarm-autoscaler=="
_LEAVE = "docker swarm leave --force >/dev/null 2>&1 || true\n"  # a started pool machine's old swarm
# Long enough for any real join token and manager address: what the start-up check renders with.
_WORST_TOKEN = "SWMTKN-1-" + "x" * 100
_WORST_MANAGER = "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"
_TICKET_FAILED = "the join ticket was refused, docker swarm join failed or its node was not confirmed"
_WORST_PIN = "A" * 43 + "="  # base64 of a SHA-256, as `join_tls.join_pin` returns


def join_line(token: str, manager_address: str, paused: bool = False) -> str:
    """The swarm join. `paused`: the node joins with availability pause, so swarm places nothing there
    until the daemon takes it in and sets it active (the dynamic mode: `Policy.join_paused`)."""
    flag = "--availability pause " if paused else ""
    return f"docker swarm join {flag}--token {shlex.quote(token)} {shlex.quote(manager_address)}"


def ticket_join(urls: Sequence[str], join_ticket: str, paused: bool = False, *, pin: str) -> str:
    """The swarm join through the daemon's join endpoint (`adapters.join_tickets`): read this machine's
    private IP from the metadata service (IMDSv2; `AWS_EC2_METADATA_SERVICE_ENDPOINT` overrides
    169.254.169.254, as for the AWS SDKs); unless the node is in a swarm already, post the ticket from
    that address to each URL in turn until one answers, then join with the token and manager address it
    answered; then confirm the node: post the ticket and the node's id (`docker info`) the same way, so
    the daemon labels that node as this instance's (`daemon.join`). Every post is TLS whose server key
    must match `pin` (`join_tls.join_pin`; curl `--pinnedpubkey`, checked before anything is sent; `-k`
    because the certificate is self-signed: the pin is the check). Any step failing fails this attempt
    (the caller retries it, bounded, then reports a failed boot)."""
    if not TICKET.fullmatch(join_ticket):  # written into the script as it is
        raise ValueError("a join ticket is 64 hex digits")
    flag = "--availability pause " if paused else ""
    body = shlex.quote(json.dumps({"ticket": join_ticket}))
    confirm = f'"{{\\"ticket\\": \\"{join_ticket}\\", \\"node\\": \\"$node_id\\"}}"'
    pinned = shlex.quote(f"sha256//{pin}")
    tries = " ".join(shlex.quote(url) for url in urls)
    post = f'curl -sf --max-time 20 --interface "$private_ip" -H "Content-Type: application/json" -k --pinnedpubkey {pinned}'
    return (
        'imds="${AWS_EC2_METADATA_SERVICE_ENDPOINT:-http://169.254.169.254}"; imds="${imds%/}"\n'
        "    imds_token=$(curl -sf --max-time 5 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' "
        '"$imds/latest/api/token") || return 1\n'
        '    private_ip=$(curl -sf --max-time 5 -H "X-aws-ec2-metadata-token: $imds_token" '
        '"$imds/latest/meta-data/local-ipv4") || return 1\n'
        "    if [ \"$(docker info --format '{{.Swarm.LocalNodeState}}' 2>/dev/null)\" != active ]; then\n"
        '        answer=""\n'
        f"        for url in {tries}; do\n"
        f'            answer=$({post} --data {body} "$url") && break\n'
        "        done\n"
        '        [ -n "$answer" ] || return 1\n'
        '        join_token=$(printf \'%s\' "$answer" | sed -n \'s/.*"token": *"\\([A-Za-z0-9-]*\\)".*/\\1/p\')\n'
        '        join_manager=$(printf \'%s\' "$answer" | sed -n \'s/.*"manager": *"\\([][0-9A-Za-z.:-]*\\)".*/\\1/p\')\n'
        '        [ -n "$join_token" ] && [ -n "$join_manager" ] || return 1\n'
        f'        docker swarm join {flag}--token "$join_token" "$join_manager" || return 1\n'
        "    fi\n"
        "    node_id=$(docker info --format '{{.Swarm.NodeID}}' 2>/dev/null)\n"
        '    case "$node_id" in ""|*[!0-9a-z]*) return 1 ;; esac\n'
        f"    for url in {tries}; do\n"
        f'        {post} --data {confirm} "$url" >/dev/null && return 0\n'
        "    done\n"
        "    return 1"
    )


def _failure_handler(stop: bool) -> str:
    """Defines `swarm_autoscaler_boot_failed REASON` and calls it when the script exits non-zero."""
    then = f"    {POOL_STOP_LINE}\n" if stop else ""
    return (
        "# a boot that cannot finish says why on the console (added by swarm-autoscaler)\n"
        "swarm_autoscaler_boot_failed() {\n"
        "    trap - EXIT\n"
        f'    echo "{BOOT_FAILED_LINE} $1 (host $(hostname))" >&2\n'
        f"{then}"
        "    exit 1\n"
        "}\n"
        'trap \'rc=$?; [ "$rc" -eq 0 ] || swarm_autoscaler_boot_failed "exit status $rc"\' EXIT\n'
    )


def _wait_and_join(
    join: str, first: str = "", failed: str = "docker swarm join failed", *, joined_is_done: bool = True
) -> str:
    """Wait for dockerd, run `first`, then join with bounded retries (with `joined_is_done`, a node
    already in a swarm counts as joined; the ticket's join checks that itself, as it confirms after);
    `failed` starts the failed boot's reason."""
    polls = DOCKERD_WAIT_S // 2
    return (
        "# wait for dockerd, then join the swarm as a worker, retried (added by swarm-autoscaler)\n"
        "n=0\n"
        "until docker info >/dev/null 2>&1; do\n"
        "    n=$((n + 1))\n"
        f'    [ "$n" -lt {polls} ] || swarm_autoscaler_boot_failed "dockerd did not answer within {DOCKERD_WAIT_S} s"\n'
        "    sleep 2\n"
        "done\n"
        f"{first}"
        "swarm_autoscaler_join() {\n"
        + (
            "    [ \"$(docker info --format '{{.Swarm.LocalNodeState}}' 2>/dev/null)\" = active ] && return 0\n"
            if joined_is_done
            else ""
        )
        + f"    {join}\n"
        "}\n"
        "n=0\n"
        "until swarm_autoscaler_join; do\n"
        "    n=$((n + 1))\n"
        f'    [ "$n" -lt {JOIN_ATTEMPTS} ] || swarm_autoscaler_boot_failed "{failed} {JOIN_ATTEMPTS} times"\n'
        "    sleep $((n * 5))\n"
        "done\n"
        "trap - EXIT\n"
    )


def _split_shebang(boot_script: str) -> tuple[str, str]:
    """(the first line to run under, the boot script's body): a script without a shebang runs under bash."""
    script = boot_script.strip("\n")
    if script.startswith("#!"):
        first, _, body = script.partition("\n")
        return f"{first}\n", body.strip("\n")
    return "#!/bin/bash\nset -eu\n", script


def _every_boot(script: str) -> str:
    """`script` as MIME multipart user data whose cloud-config makes cloud-init run it on every boot
    (user data scripts run once per instance by default): a pool machine's user data is rewritten
    before each start, and must run on that boot."""
    b = _MIME_BOUNDARY
    return (
        f'Content-Type: multipart/mixed; boundary="{b}"\nMIME-Version: 1.0\n\n'
        f'--{b}\nContent-Type: text/cloud-config; charset="us-ascii"\n\n'
        "#cloud-config\ncloud_final_modules:\n- [scripts-user, always]\n\n"
        f'--{b}\nContent-Type: text/x-shellscript; charset="us-ascii"\n\n{script}\n--{b}--\n'
    )


def render_user_data(boot_script: str, token: str, manager_address: str, paused: bool = False) -> str:
    """The configured boot script, then the wait for dockerd and the swarm join (`join_line`), a failed
    boot stopping the machine (module doc). A script without a shebang runs under bash."""
    return _launch(boot_script, _wait_and_join(join_line(token, manager_address, paused)))


def render_ticket_user_data(
    boot_script: str, urls: Sequence[str], join_ticket: str, paused: bool = False, *, pin: str
) -> str:
    """`render_user_data` with the join through the daemon's join endpoint (`ticket_join`, its key
    checked against `pin`): the user data carries the ticket and the pin, never the swarm join token."""
    join = ticket_join(urls, join_ticket, paused, pin=pin)
    return _launch(boot_script, _wait_and_join(join, failed=_TICKET_FAILED, joined_is_done=False))


def _launch(boot_script: str, join: str) -> str:
    head, body = _split_shebang(boot_script)
    body = f"{body}\n\n" if body else ""
    return f"{head}{_failure_handler(stop=True)}\n{body}{join}"


def render_pool_user_data(boot_script: str) -> str:
    """A warm-pool machine's first boot: the boot script, then stop (it never joins on that boot)."""
    head, body = _split_shebang(boot_script)
    body = f"{body}\n\n" if body else ""
    return _every_boot(
        f"{head}{_failure_handler(stop=False)}\n{body}"
        f"# prepared for the warm pool: stop this machine (added by swarm-autoscaler)\ntrap - EXIT\n{POOL_STOP_LINE}\n"
    )


def render_start_user_data(token: str, manager_address: str, paused: bool = False) -> str:
    """What a pool machine runs when started: leave the swarm it may have been in (its old node was
    removed when it was stopped), then join afresh. The boot script already ran on its first boot."""
    return _start(_wait_and_join(join_line(token, manager_address, paused), first=_LEAVE))


def render_ticket_start_user_data(
    urls: Sequence[str], join_ticket: str, paused: bool = False, *, pin: str
) -> str:
    """`render_start_user_data` with the join through the daemon's join endpoint (a fresh ticket for
    each start, the endpoint's key checked against `pin`: `ticket_join`)."""
    join = ticket_join(urls, join_ticket, paused, pin=pin)
    return _start(_wait_and_join(join, first=_LEAVE, failed=_TICKET_FAILED, joined_is_done=False))


def _start(join: str) -> str:
    return _every_boot(
        "#!/bin/bash\nset -u\n"
        f"{_failure_handler(stop=False)}"
        "# started from the warm pool: leave the old swarm, join afresh (added by swarm-autoscaler)\n"
        f"{join}"
    )


# <account>.dkr.ecr.<region>.amazonaws.com[.cn]/<repository>...: an image in ECR
ECR_IMAGE = re.compile(r"^(?P<host>\d{12}\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?)/")


def ecr_pull_lines(images: Sequence[str]) -> str:
    """Boot-script lines that pull `images` on the machine, logging in to ECR first (with the instance
    role, through the AWS CLI) for each ECR registry among them: swarm's own pull uses the credentials
    given at deploy time, which ECR expires after 12 hours, and falls back to an image already on the
    node. Put them in a type's `boot_script` (docs/worker-service.md, "Pulling from ECR"). They wait for
    dockerd first (bounded); a failed login or pull fails the boot, which then says so."""
    if not images:
        return ""
    lines = [
        "# pull the worker image, logging in to ECR with the instance role (swarm-autoscaler's ecr_pull_lines)",
        'n=0; until docker info >/dev/null 2>&1; do n=$((n + 1)); [ "$n" -lt 150 ] || exit 1; sleep 2; done',
    ]
    registries: dict[str, str] = {}
    for image in images:
        found = ECR_IMAGE.match(image)
        if found is not None:
            registries.setdefault(found.group("host"), found.group("region"))
    for host, region in registries.items():
        lines.append(
            f"aws ecr get-login-password --region {shlex.quote(region)}"
            f" | docker login --username AWS --password-stdin {shlex.quote(host)}"
        )
    lines += [f"docker pull --quiet {shlex.quote(image)}" for image in dict.fromkeys(images)]
    return "\n".join(lines) + "\n"


def check_user_data(type_name: str, boot_script: str, join_urls: Sequence[str] = ()) -> None:
    """Refuse a type whose user data (launch or warm pool, rendered with a worst-case join, or with a
    ticket for `join_urls` when given) is over EC2's limit: every launch of it would fail, so the
    daemon says so at start-up."""
    launch = (
        render_ticket_user_data(boot_script, join_urls, "f" * 64, paused=True, pin=_WORST_PIN)
        if join_urls
        else render_user_data(boot_script, _WORST_TOKEN, _WORST_MANAGER, paused=True)
    )
    for user_data in (launch, render_pool_user_data(boot_script)):
        size = len(user_data.encode())
        if size > USER_DATA_LIMIT:
            raise ConfigurationError(
                f"the user data of instance type {type_name} is {size} bytes, over EC2's limit of "
                f"{USER_DATA_LIMIT} (its boot script with the swarm join added): shorten that type's "
                "boot script (AUTOSCALER_TYPES), for example by fetching the long part from S3"
            )
