-- Record format 2 (docs/REDIS_PROTOCOL.md); format 1 is still read, never written.
-- The library functions of the per-completion path as locals: each call then
-- skips a global and a table lookup.
local str_find, str_sub, str_byte, str_char, str_match =
  string.find, string.sub, string.byte, string.char, string.match
local pack, call = struct.pack, redis.call
local function uv(n)
  local s = ''
  while n >= 128 do
    s = s .. string.char(n % 128 + 128)
    n = math.floor(n / 128)
  end
  return s .. string.char(n)
end
-- The largest varint a record holds: 2^53 - 1, the largest integer a Lua number
-- (a double) holds exactly. A fence read rounded would be raised to the fence it
-- already has (2^53 + 1 is 2^53 as a double).
local MAX_VARINT = 9007199254740991
-- The largest attempt: 2^32 - 1, as a claim reports it (32 bits, as the other
-- stores keep it). A larger one would be read back cut by the C++ store.
local MAX_ATTEMPT = 4294967295
local function rv(v, i)
  local n, m = 0, 1
  for _ = 1, 8 do
    local b = string.byte(v, i)
    if not b then return nil end
    i = i + 1
    if b < 128 then
      -- Canonical only: a last byte of 0 after others is a padded encoding.
      if b == 0 and m > 1 then return nil end
      n = n + b * m
      if n > MAX_VARINT then return nil end
      return n, i
    end
    n, m = n + (b - 128) * m, m * 128
  end
  return nil
end
local function encode(state, status, tok, fence, attempt, keep, fp, result)
  local flags, v = 64 + state + 4 * status, ''
  if fp ~= '' then flags, v = flags + 16, string.char(#fp) .. fp end
  if state == 1 then v = uv(keep) .. v end
  return string.char(flags) .. tok .. uv(fence) .. uv(attempt) .. v .. result
end
local function decode(v)
  local b = string.byte(v, 1)
  if b == 1 and #v >= 27 then
    local _, ss, tok, fence, attempt, ld, n = struct.unpack('>BBc8I6I4I6B', v)
    local state, status = ss % 16, math.floor(ss / 16)
    if state < 1 or state > 3 or status > 2 or n > 64 or #v < 27 + n then return nil end
    return {fmt = 1, state = state, status = status, tok = tok, fence = fence,
            attempt = attempt, ld = ld, fp = string.sub(v, 28, 27 + n),
            result = string.sub(v, 28 + n)}
  end
  if not b or b < 64 or b >= 96 or #v < 11 then return nil end
  local state, status = b % 4, math.floor(b / 4) % 4
  -- A status only on COMPLETED (0x45 is not a record).
  if state == 0 or status == 3 or (state ~= 2 and status ~= 0) then return nil end
  local r = {fmt = 2, state = state, status = status, tok = string.sub(v, 2, 9), fp = ''}
  local i
  r.fence, i = rv(v, 10)
  if not r.fence then return nil end
  r.attempt, i = rv(v, i)
  if not r.attempt or r.attempt > MAX_ATTEMPT then return nil end
  if state == 1 then
    r.keep, i = rv(v, i)
    if not r.keep then return nil end
  end
  if b % 32 >= 16 then
    local n = string.byte(v, i)
    if not n or n == 0 or n > 64 or #v < i + n then return nil end
    r.fp, i = string.sub(v, i + 1, i + n), i + 1 + n
  end
  r.result = string.sub(v, i)
  if state ~= 2 and r.result ~= '' then return nil end
  return r
end
-- IN_PROGRESS only: format 2 keeps the distance from lease end to expiry.
local function lease_deadline(key, r)
  if r.fmt == 1 then return r.ld end
  return redis.call('PEXPIRETIME', key) - r.keep
end
local function load(key, what)
  local v = redis.call('GET', key)
  if not v then return nil end
  local r = decode(v)
  if not r then
    return nil, redis.error_reply('DEDUPCORRUPT ' .. what .. ': record is not dedup format 1 or 2 (first byte ' .. tostring((string.byte(v, 1))) .. ', ' .. #v .. ' bytes)')
  end
  return r
end
-- Arguments, checked as the C++ API checks them (src/core/store.cc); a bad one is
-- an error reply 'DEDUPARGS <script>: <what>' and nothing is read or written.
local MAX_MS = 315360000000  -- 10 years (kMaxDuration)
local function bad_args(what, why)
  return redis.error_reply('DEDUPARGS ' .. what .. ': ' .. why)
end
-- A single-key script's record key, or (sent with numkeys 0) nil and its error.
-- With `nargs`, also nil and an error unless the call has exactly 1 key and
-- `nargs` arguments: a second key or an extra argument was ignored, and a
-- client's mistake went unnoticed.
-- The error of a call that has not exactly `nkeys` keys and `nargs` arguments,
-- else nil.
local function arity_error(what, nkeys, nargs)
  if #KEYS == nkeys and #ARGV == nargs then return nil end
  return bad_args(what, 'needs ' .. nkeys .. (nkeys == 1 and ' key' or ' keys') .. ' and ' ..
                  nargs .. ' arguments, got ' .. #KEYS .. ' and ' .. #ARGV)
end
local function record_key(what, nargs)
  local k = KEYS[1]
  if k == nil then return nil, bad_args(what, 'needs 1 key (the record key), got 0') end
  if nargs then
    local err = arity_error(what, 1, nargs)
    if err then return nil, err end
  end
  return k
end
-- A duration in ms: decimal digits, no sign or leading zero, 1 to MAX_MS.
local function arg_ms(s)
  if type(s) ~= 'string' or #s > 12 or not str_find(s, '^[1-9][0-9]*$') then return nil end
  local n = tonumber(s)
  if n > MAX_MS then return nil end
  return n
end
-- A token: exactly 16 lower-case hex digits, not all zero; returned as 8 bytes.
local function arg_token(s)
  if type(s) ~= 'string' or #s ~= 16 or not str_find(s, '^[0-9a-f]+$')
      or s == '0000000000000000' then
    return nil
  end
  return pack('>I4I4', tonumber(str_sub(s, 1, 8), 16), tonumber(str_sub(s, 9, 16), 16))
end
-- A non-negative decimal integer up to `max` (no sign, no leading zero).
local function arg_uint(s, max)
  if type(s) ~= 'string' or #s > 10 or not string.find(s, '^[0-9]+$')
      or (#s > 1 and string.sub(s, 1, 1) == '0') then
    return nil
  end
  local n = tonumber(s)
  if n > max then return nil end
  return n
end
-- The name a batch script gives completion i in its errors. Built only for an
-- error: formatting a number is most of what checking a completion costs.
local function nth(what, i)
  if i then return what .. ': completion ' .. i end
  return what
end
-- The completion scripts' read of a record, without decode()'s table: an
-- IN_PROGRESS format-2 record in one pattern match (flags 0x41 or 0x51, token,
-- fence, attempt, keep, then the fingerprint). It takes exactly the IN_PROGRESS
-- records decode() takes whose fence, attempt and keep are >= 1 (every record a
-- claim writes); anything else (other states, format 1, 0 in a field, corrupt
-- bytes) goes to load(), so the answers are decode()'s. The match captures
-- positions, not strings: each string made costs the server a hash and an
-- allocation.
local IN_PROGRESS2 = '^([AQ])........[\128-\255]*[\1-\127]()[\128-\255]*[\1-\127]()' ..
                     '[\128-\255]*[\1-\127]()'
-- For a record value v: its token and the COMPLETED record's bytes between the
-- flags and the result (token, fence, attempt, fingerprint), and the flags byte
-- of COMPLETED/ok; nil when v is not such a record (load() decides).
-- The fence and attempt of v when v is an IN_PROGRESS record without a
-- fingerprint whose fence and attempt take one byte each (flags 0x41, then the
-- keep: at most 8 bytes, at most MAX_VARINT, to the end); nil otherwise. Two C
-- calls instead of one pattern match with its captures (~4.9 k server
-- instructions, docs/PERFORMANCE.md); the keep's own check stays a pattern,
-- anchored at both ends, with nothing captured.
local function short_claim(v)
  local fl, _, _, _, _, _, _, _, _, fe, at = str_byte(v, 1, 11)
  if fl == 65 and at and fe > 0 and fe < 128 and at > 0 and at < 128 and #v <= 19
      and str_find(v, '^[\128-\255]*[\1-\127]$', 12)
      and (#v < 19 or str_byte(v, 19) <= 15) then
    return fe, at
  end
end
local function quick_in_progress(v)
  -- First, without the pattern, such a record with one-byte fence and attempt
  -- (what the C++ store writes with SET ... NX, and its early re-claims).
  if short_claim(v) then return str_sub(v, 2, 9), str_sub(v, 2, 11), 0x42 end
  -- The attempt starts at a, the keep at k; the fingerprint (if any) at e.
  local fl, a, k, e = str_match(v, IN_PROGRESS2)
  if not fl or a > 18 or k - a > 5 or e - k > 8 then return nil end
  -- An 8-byte varint over MAX_VARINT, a 5-byte attempt over MAX_ATTEMPT (their
  -- last byte over 15): decode() refuses them.
  if (a == 18 and str_byte(v, 17) > 15) or (k - a == 5 and str_byte(v, k - 1) > 15)
      or (e - k == 8 and str_byte(v, e - 1) > 15) then
    return nil
  end
  if fl == 'A' then
    if e <= #v then return nil end
    return str_sub(v, 2, 9), str_sub(v, 2, k - 1), 0x42
  end
  local n = str_byte(v, e)
  if not n or n == 0 or n > 64 or #v ~= e + n then return nil end
  return str_sub(v, 2, 9), str_sub(v, 2, k - 1) .. str_sub(v, e), 0x52
end
-- Whether v is the record of a first claim without a fingerprint, exactly as the
-- C++ store writes it with SET ... NX (flags 0x41, fence 1, attempt 1, then a keep
-- of 1 to 8 bytes, at most MAX_VARINT, to the end): a record decode() takes, whose
-- COMPLETED record with status 0 and result res is 'B' .. token .. '\1\1' .. res.
-- complete_ack_stream.lua keeps v itself and compares its token (the 8 bytes at
-- 2) with str_find(v, token, 2, true) == 2: no string is made for the token or the
-- record's body (each str_sub() measured ~1.1 k server instructions).
local function first_claim(v)
  local fe, at = short_claim(v)
  return fe == 1 and at == 1
end
-- The flags byte quick_in_progress() gives -> that byte as a string.
local COMPLETED_OK = {[0x42] = 'B', [0x52] = 'R'}
-- Completion status -> the flags byte of a COMPLETED record without a fingerprint.
local COMPLETED_FIRST = {[0] = 'B', 'F', 'J'}
-- Completion status as given -> its number (what arg_uint(s, 2) accepts).
local STATUS = {['0'] = 0, ['1'] = 1, ['2'] = 2}
-- Where a completion script finds completion i (i = 1..n): its record key is
-- KEYS[key0 + i]; with a = base + (i - 1) * stride, its token is ARGV[a + 1], its
-- retention ARGV[a + 2] (or `px` for all), its status ARGV[a + 3] (or `st` for
-- all), its result ARGV[a + res], and when acked its group ARGV[a + group] (or
-- the script's own) and its entry ID ARGV[a + id]. With `raw_token` the token
-- is its 8 bytes (big-endian) instead of 16 hex digits: their check and
-- conversion cost the server more than everything else read per completion.
-- Made once per script, so that each read is one table lookup.
local function layout(t)
  t.base, t.key0 = t.base or 0, t.key0 or 0
  return t
end
local ZERO_TOKEN = string.rep('\0', 8)
-- complete.lua and complete_batch.lua: token, retention, status, result.
local LAYOUT4 = layout({stride = 4, res = 4})
-- Completions of a batch (the batch scripts and complete.lua), without a table
-- per completion, laid out as `L` says (layout()). Checks every completion's
-- arguments as complete_args() does, in the same order and with the same errors
-- (a retention equal to the one before was checked already), then reads every
-- record; an error reply (nothing written) or the state for complete_many_write().
local function complete_many_read(what, n, L, name_each)
  local toks, px, st = {}, {}, {}
  local stride, base, key0, res_at, group_at, id_at = L.stride, L.base, L.key0, L.res, L.group,
                                                      L.id
  local raw_token = L.raw_token
  -- false: no argument equals it, so the first retention (even a missing one)
  -- is checked.
  local last_px = false
  for i = 1, n do
    local a = base + (i - 1) * stride
    local nm = name_each and i or nil
    local tok
    if raw_token then
      tok = ARGV[a + 1]
      if type(tok) ~= 'string' or #tok ~= 8 or tok == ZERO_TOKEN then
        return nil, bad_args(nth(what, nm), 'token must be 8 bytes, not all 0')
      end
    else
      tok = arg_token(ARGV[a + 1])
      if not tok then
        return nil, bad_args(nth(what, nm), 'token must be 16 lower-case hex digits, not all 0')
      end
    end
    local p = L.px or ARGV[a + 2]
    if p ~= last_px then
      if not arg_ms(p) then
        return nil, bad_args(nth(what, nm), 'retention must be an integer of ms, 1 to ' .. MAX_MS)
      end
      last_px = p
    end
    local s = L.st or STATUS[ARGV[a + 3]]
    if not s then return nil, bad_args(nth(what, nm), 'status must be 0, 1 or 2') end
    local res = ARGV[a + res_at]
    if type(res) ~= 'string' or #res > 1048576 then
      return nil, bad_args(nth(what, nm), 'result must be at most 1048576 bytes')
    end
    if id_at and ((group_at and ARGV[a + group_at] == '') or ARGV[a + id_at] == '') then
      return nil, bad_args(nth(what, nm), 'group and entry ID must not be empty')
    end
    toks[i], px[i], st[i] = tok, p, s
  end
  -- Per key: the record of a first claim in fast[key] (first_claim(); rtok[key]
  -- true), or its token, body and flags (quick read), or false and the decoded
  -- record in full[key] (load()), or false alone (no record).
  local rtok, body, flags, full, fast = {}, {}, {}, {}, {}
  for i = 1, n do
    local key = KEYS[key0 + i]
    if rtok[key] == nil then
      local v = call('GET', key)
      local t, b, f
      if v and first_claim(v) then
        rtok[key], fast[key] = true, v
      elseif v then t, b, f = quick_in_progress(v) end
      if t then
        rtok[key], body[key], flags[key] = t, b, f
      elseif not fast[key] then
        rtok[key] = false
        if v then
          local r, err = load(key, what)
          if err then return nil, err end
          full[key] = r
        end
      end
    end
  end
  return {toks = toks, px = px, st = st, rtok = rtok, body = body, flags = flags, full = full,
          fast = fast, L = L}
end
-- Completion i of a batch read by complete_many_read(): 1 OK (COMPLETED, kept
-- until now + retention), 0 LOST (nothing changed). A key completed here
-- answers LOST to a later completion of it in the batch.
local function complete_many_write(m, i)
  local L = m.L
  local key = KEYS[L.key0 + i]
  local t = m.rtok[key]
  local v = m.fast[key]
  if v then
    -- A first claim's record: its token compared in place, its COMPLETED record
    -- is flags, token, fence 1, attempt 1, result (what encode() writes).
    if str_find(v, m.toks[i], 2, true) ~= 2 then return 0 end
    call('SET', key, COMPLETED_FIRST[m.st[i]] .. m.toks[i] .. '\1\1' ..
                     ARGV[L.base + (i - 1) * L.stride + L.res], 'PX', m.px[i])
    m.rtok[key], m.fast[key] = nil, nil
    return 1
  end
  if t then
    if t ~= m.toks[i] then return 0 end
    local result = ARGV[L.base + (i - 1) * L.stride + L.res]
    call('SET', key, str_char(m.flags[key] + 4 * m.st[i]) .. m.body[key] .. result,
               'PX', m.px[i])
    m.rtok[key] = nil
    return 1
  end
  local r = m.full[key]
  if not r or r.state ~= 1 or r.tok ~= m.toks[i] then return 0 end
  m.full[key] = nil
  call('SET', key, encode(2, m.st[i], r.tok, r.fence, r.attempt, 0, r.fp,
                                ARGV[L.base + (i - 1) * L.stride + L.res]), 'PX', m.px[i])
  return 1
end
-- XACK of `ids` on stream and group, as many commands as it takes: unpack() of
-- more than about 8000 values is a Lua error (LUAI_MAXCSTACK), raised before
-- pcall, after the completions were written. The number of entries acked, or
-- nil when an XACK failed (no group, not a stream).
local XACK_CHUNK = 1000
local function xack_many(stream, group, ids)
  local acked = 0
  for j = 1, #ids, XACK_CHUNK do
    local ok, c = pcall(call, 'XACK', stream, group,
                        unpack(ids, j, math.min(j + XACK_CHUNK - 1, #ids)))
    if not ok then return nil end
    acked = acked + c
  end
  return acked
end
