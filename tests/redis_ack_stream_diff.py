"""complete_ack_batch.lua vs complete_ack_stream.lua on the same records (see
tests/redis_ack_stream_diff_test.sh). Speaks RESP itself: redis-cli cannot send
arguments holding NUL bytes.

  redis_ack_stream_diff.py PORT LUA_DIR TRIALS
"""
import os, random, socket, struct, sys, re
port = int(sys.argv[1]); lua_dir = sys.argv[2]; trials = int(sys.argv[3]) if len(sys.argv) > 3 else 400
class R:
    def __init__(s):
        s.s = socket.create_connection(('127.0.0.1', port)); s.f = s.s.makefile('rb')
    def cmd(s, *a):
        out = [b'*%d\r\n' % len(a)]
        for x in a:
            if isinstance(x, int): x = str(x)
            if isinstance(x, str): x = x.encode()
            out.append(b'$%d\r\n%s\r\n' % (len(x), x))
        s.s.sendall(b''.join(out)); return s.read()
    def read(s):
        l = s.f.readline()[:-2]; t, r = l[:1], l[1:]
        if t == b'+': return r.decode()
        if t == b'-': return ('ERR', r.decode(errors='replace'))
        if t == b':': return int(r)
        if t == b'$':
            n = int(r)
            if n < 0: return None
            d = s.f.read(n + 2); return d[:-2]
        if t == b'*':
            n = int(r)
            if n < 0: return None
            return [s.read() for _ in range(n)]
        raise Exception('bad ' + repr(l))
# The scripts as the build expands them (--@dedup-include, see
# src/stores/redis/CMakeLists.txt).
def body(name):
    t = open(os.path.join(lua_dir, name + '.lua')).read()
    while '--@dedup-include' in t:
        t = re.sub(r'--@dedup-include ([a-z_]+\.lua)\n', lambda m: open(os.path.join(lua_dir, m.group(1))).read(), t)
    return t
r = R()
old = r.cmd('SCRIPT', 'LOAD', body('complete_ack_batch')); new = r.cmd('SCRIPT', 'LOAD', body('complete_ack_stream'))
assert isinstance(old, bytes) and isinstance(new, bytes), (old, new); old, new = old.decode(), new.decode()
rnd = random.Random(int(os.environ.get('SEED', '1')))
def uv(n):
    s = b''
    while n >= 128: s += bytes([n % 128 + 128]); n //= 128
    return s + bytes([n])
# Now and then a varint decode() refuses: 9 bytes long, or padded (a last 0).
def uvx(n):
    k = rnd.random()
    if k < 0.05: return b'\x81' * 8 + b'\x01'
    if k < 0.1: return uv(n)[:-1] + bytes([uv(n)[-1] | 0x80]) + b'\x00'
    return uv(n)
SPECIAL = [b'%', b'\0', b']', b'-', b'^', b'[', b'.', b'*', b'$', b'(', b')', b'\xff', b'\x80', b'A', b'Q']
def token():
    k = rnd.random()
    if k < 0.5: return bytes(rnd.choice(SPECIAL)[0] for _ in range(8))
    return bytes(rnd.randrange(256) for _ in range(8))
# The records quick_in_progress() reads without its pattern (a first claim
# without a fingerprint: flags 0x41, one-byte fence and attempt, then the keep to
# the end), around the edges of that shortcut: fence or attempt 0 or of two
# bytes, a keep of 8 bytes up to 2^53 - 1 and just past it, of 9 bytes, padded, 0,
# a record cut before its keep.
FIRST_KEEPS = [uv(1), uv(127), uv(128), uv(60000), uv(86400000), uv(2**35), uv(2**53 - 1),
               b'\x80' * 7 + b'\x0f', b'\xff' * 7 + b'\x0f', b'\x80' * 7 + b'\x10',
               b'\x81' * 8 + b'\x01', b'\x80\x00', b'\x00', b'\x80', b'']
def first_claim(tok):
    fence = rnd.choice([b'\x01', b'\x01', b'\x02', b'\x7f', b'\x00', b'\x80\x01', b'\xff'])
    att = rnd.choice([b'\x01', b'\x01', b'\x7f', b'\x00', b'\x81\x01', b'\x80'])
    return b'\x41' + tok + fence + att + rnd.choice(FIRST_KEEPS)
def record(tok):
    if rnd.random() < 0.25: return first_claim(tok)
    k = rnd.random()
    fp = b'' if rnd.random() < 0.5 else bytes(rnd.randrange(256) for _ in range(rnd.choice([1, 5, 64, 65])))
    fence = rnd.choice([0, 1, 2, 127, 128, 300, 2**40, 2**53 - 1, 2**49])
    att = rnd.choice([0, 1, 3, 128, 2**20, 2**28 - 1, 2**32 - 1, 2**32, 2**40])
    if k < 0.55:
        flags = 0x41 + (0x10 if fp else 0)
        v = bytes([flags]) + tok + uvx(fence) + uvx(att) + uvx(rnd.choice([0, 1, 500, 60000, 2**35]))
        if fp: v += bytes([len(fp)]) + fp
    elif k < 0.75:
        st = rnd.choice([2, 3]); status = rnd.randrange(3) if st == 2 else 0
        v = bytes([0x40 + st + 4 * status + (0x10 if fp else 0)]) + tok + uv(fence) + uv(att)
        if fp: v += bytes([len(fp)]) + fp
        if st == 2: v += bytes(rnd.randrange(256) for _ in range(rnd.randrange(5)))
    elif k < 0.9:
        ss = rnd.choice([1, 2, 3, 0x12, 0x22, 4, 0x32])
        v = struct.pack('>BB8s', 1, ss, tok) + fence.to_bytes(8, 'big')[-6:] + (att % 2**32).to_bytes(4, 'big') + (12345).to_bytes(6, 'big') + bytes([len(fp)]) + fp + b'res'
    else:
        v = rnd.choice([b'', b'A', b'\x41' + tok, b'garbage%]^-\0'])
    # mutate
    m = rnd.random()
    if m < 0.15 and v:
        i = rnd.randrange(len(v)); v = v[:i] + bytes([rnd.randrange(256)]) + v[i + 1:]
    elif m < 0.22 and v:
        v = v[:rnd.randrange(len(v))]
    elif m < 0.27:
        v = v + bytes([rnd.randrange(256)])
    return v
def norm(x):
    if isinstance(x, tuple):
        e = x[1]
        e = e.replace('complete_ack_batch', 'S').replace('complete_ack_stream', 'S')
        e = re.sub(r'token must be .*', 'token bad', e)
        e = re.sub(r'script: \w+', 'script', e)
        return ('ERR', e.split(' ')[0] if e.startswith('DEDUPARGS') else e[:60])
    return x
fails = 0
# Both scripts share record.lua, so the comparison above cannot see a fault in
# its quick read: quick_in_progress() is checked against decode() directly. It
# must take exactly the format-2 IN_PROGRESS records decode() takes whose fence,
# attempt and keep are >= 1, and give their token and COMPLETED bytes.
QUICK = body('record') + '''
local bad = {}
for j, v in ipairs(ARGV) do
  local t, b, f = quick_in_progress(v)
  local r = decode(v)
  -- Past 2^53 decode()'s numbers are not exact (Lua doubles): not compared.
  if r and (r.fence >= 2^53 or r.attempt >= 2^53 or (r.keep or 0) >= 2^53) then r = 'skip' end
  local want = r ~= 'skip' and r and r.fmt == 2 and r.state == 1 and r.fence >= 1 and r.attempt >= 1 and r.keep >= 1
  if r == 'skip' then
  elseif want then
    if t ~= r.tok or string.char(f) .. b ~= encode(2, 0, r.tok, r.fence, r.attempt, 0, r.fp, '') then
      bad[#bad + 1] = j
    end
  elseif t then
    bad[#bad + 1] = j
  end
  -- first_claim(): exactly the records decode() takes as IN_PROGRESS format 2
  -- with fence 1, attempt 1, a keep >= 1 and no fingerprint.
  local first = r ~= 'skip' and want and r.fence == 1 and r.attempt == 1 and r.fp == ''
  if r ~= 'skip' and first_claim(v) ~= (first and true or false) then bad[#bad + 1] = j end
  -- complete_many_write()'s bytes for such a record, every status.
  if first then
    for st = 0, 2 do
      if COMPLETED_FIRST[st] .. r.tok .. '\1\1' ~= encode(2, st, r.tok, 1, 1, 0, '', '') then
        bad[#bad + 1] = j
      end
    end
  end
end
return bad
'''
qsha = r.cmd('SCRIPT', 'LOAD', QUICK).decode()
for chunk in range(max(1, trials // 10)):
    vals = [record(token()) for _ in range(200)]
    got = r.cmd('EVALSHA', qsha, 0, *vals)
    if got:
        fails += 1
        if fails <= 5: print('quick read differs from decode() on', [vals[j - 1] for j in got[:5]])
# And not by chance alone: every record of flags 0x41 (and 0x51) whose fence and
# attempt are one of a few encodings around the shortcuts' edges (0, 1, 2, 127,
# 128, padded, 2 bytes), followed by every keep made of these bytes up to a length
# past the 8 a varint may take: continuations 0x00 0x80 0xff (0x00 mid-varint ends
# it early), a last byte 0x00 0x01 0x0f 0x10 0x7f 0x80 (0x0f / 0x10 are the edge of
# 2^53 - 1 for a keep of 8 bytes). Checked against decode() as above.
def keeps(maxlen):
    out, level = [b''], [b'']
    for _ in range(maxlen):
        out += [p + bytes([l]) for p in level for l in (0, 1, 15, 16, 127, 128)]
        level = [p + bytes([c]) for p in level for c in (0, 128, 255)]
    return out
FENCES = [b'\x01', b'\x00', b'\x02', b'\x7f', b'\x80', b'\x81\x01', b'\x80\x00', b'\x01\x01']
sweep = [b'\x41' + b'\x01%]^-[$\xff' + b'\x01\x01' + k for k in keeps(9)]
for k in keeps(4):
    for fe in FENCES:
        for at in FENCES:
            sweep.append(b'\x41' + b'A\x01\x01\x05AAAA' + fe + at + k)
            sweep.append(b'\x51' + b'\x00\x00\x00\x00\x00\x00\x00\x01' + fe + at + k + b'\x01x')
swept = 0
for j in range(0, len(sweep), 2000):
    vals = sweep[j:j + 2000]
    got = r.cmd('EVALSHA', qsha, 0, *vals)
    if got:
        swept += 1
        if swept <= 5: print('quick read differs from decode() on', [vals[i - 1] for i in got[:5]])
fails += swept
for trial in range(trials):
    r.cmd('FLUSHALL')
    nk = rnd.randint(1, 5)
    toks, recs = {}, {}
    for j in range(nk):
        t = token(); toks[j] = t
        k = rnd.random()
        if k < 0.9:
            v = record(t); px = rnd.choice([100000, 5000000]); recs[j] = v
            for ns in ('a', 'b'): r.cmd('SET', '%s:k%d' % (ns, j), v, 'PX', px)
        elif k < 0.95:
            for ns in ('a', 'b'): r.cmd('HSET', '%s:k%d' % (ns, j), 'f', 'v')
    nostream = rnd.random() < 0.1
    ids = []
    if not nostream:
        for e in range(4):
            ids.append('%d-1' % (e + 1))
            for ns in ('a', 'b'): r.cmd('XADD', ns + ':s', ids[-1], 'f', 'v')
        for ns in ('a', 'b'):
            r.cmd('XGROUP', 'CREATE', ns + ':s', 'g', '0')
            r.cmd('XREADGROUP', 'GROUP', 'g', 'c', 'COUNT', 3, 'STREAMS', ns + ':s', '>')
    group = 'g' if rnd.random() < 0.9 else 'nog'
    ret = rnd.choice(['60000', '60000', '5000', '315360000000'])
    n = rnd.randint(1, 6)
    comps = []
    for i in range(n):
        j = rnd.randrange(nk + 1)  # nk: missing key
        t = toks.get(j, token())
        if rnd.random() < 0.2: t = token()
        # A token that is 8 bytes of the record, but not its token (at 2): the
        # token's check must look at its place only.
        elif rnd.random() < 0.1 and len(recs.get(j, b'')) >= 11:
            o = rnd.randrange(2, len(recs[j]) - 7); t = recs[j][o:o + 8]
        res = bytes(rnd.randrange(256) for _ in range(rnd.randrange(4)))
        eid = rnd.choice(ids + ['9-9']) if ids else '1-1'
        comps.append((j, t, res, eid))
    oa = ['EVALSHA', old, 2 * n] + ['a:k%d' % c[0] for c in comps] + ['a:s'] * n
    for c in comps: oa += [c[1].hex(), ret, '0', c[2], group, c[3]]
    na = ['EVALSHA', new, 1 + n, 'b:s'] + ['b:k%d' % c[0] for c in comps] + [group, ret]
    for c in comps: na += [c[1], c[2], c[3]]
    ro = r.cmd(*oa); rn = r.cmd(*na)
    bad = []
    if norm(ro) != norm(rn): bad.append(('reply', ro, rn))
    for j in range(nk + 1):
        va, vb = r.cmd('DUMP', 'a:k%d' % j), r.cmd('DUMP', 'b:k%d' % j)
        ta, tb = r.cmd('PTTL', 'a:k%d' % j), r.cmd('PTTL', 'b:k%d' % j)
        if va != vb: bad.append(('value', j, r.cmd('GET', 'a:k%d' % j) if va else None, r.cmd('GET', 'b:k%d' % j) if vb else None))
        if abs(ta - tb) > 2000: bad.append(('ttl', j, ta, tb))
    if not nostream:
        pa = r.cmd('XPENDING', 'a:s', 'g', '-', '+', 10); pb = r.cmd('XPENDING', 'b:s', 'g', '-', '+', 10)
        if [x[0] for x in pa] != [x[0] for x in pb]: bad.append(('pel', pa, pb))
    if bad:
        fails += 1
        if fails <= 5:
            print('trial', trial, 'comps', [(c[0], c[1], c[2], c[3]) for c in comps], 'group', group, 'ret', ret)
            for b in bad: print('   ', b)
# A batch larger than Lua's stack (LUAI_MAXCSTACK 8000; max_ack_batch may be up
# to 100,000): both scripts must still answer every completion (2: acked) and ack
# every entry, not fail with "too many results to unpack" after writing them all
# (both failed so on main).
def pipeline(cmds):
    for c in cmds:
        out = [b'*%d\r\n' % len(c)]
        for x in c:
            x = x if isinstance(x, bytes) else str(x).encode()
            out.append(b'$%d\r\n%s\r\n' % (len(x), x))
        r.s.sendall(b''.join(out))
    return [r.read() for _ in cmds]
big = 9000
for script, ns in ((old, 'a'), (new, 'b')):
    r.cmd('FLUSHALL')
    ids = ['%d-1' % (e + 1) for e in range(big)]
    pipeline([['XADD', ns + ':s', i, 'f', 'v'] for i in ids])
    r.cmd('XGROUP', 'CREATE', ns + ':s', 'g', '0')
    r.cmd('XREADGROUP', 'GROUP', 'g', 'c', 'STREAMS', ns + ':s', '>')
    toks = [(i + 1).to_bytes(8, 'big') for i in range(big)]
    pipeline([['SET', '%s:k%d' % (ns, i), b'A' + toks[i] + b'\x01\x01\x05', 'PX', 600000]
              for i in range(big)])
    if script == old:
        a = ['EVALSHA', old, 2 * big] + ['a:k%d' % i for i in range(big)] + ['a:s'] * big
        for i in range(big): a += [toks[i].hex(), '60000', '0', 'r', 'g', ids[i]]
    else:
        a = ['EVALSHA', new, 1 + big, 'b:s'] + ['b:k%d' % i for i in range(big)] + ['g', '60000']
        for i in range(big): a += [toks[i], 'r', ids[i]]
    rep = r.cmd(*a)
    left = r.cmd('XPENDING', ns + ':s', 'g')[0]
    if not isinstance(rep, list) or set(rep) != {2} or left != 0:
        fails += 1
        print('batch of %d on %s: reply %s, %d entries still pending' %
              (big, 'complete_ack_batch' if script == old else 'complete_ack_stream',
               rep if isinstance(rep, tuple) else sorted(set(rep)), left))
print('trials', trials, 'mismatches', fails)
sys.exit(1 if fails else 0)
