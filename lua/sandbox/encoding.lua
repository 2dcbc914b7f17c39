local _VERSION = '0.1.0'

-- libsandbox's module sandbox/encoding: run as chunk(M, internal), see sandbox/core.lua.

-- == Section: Encodings ===================================================================
-- Owns: base64 (file content), payload and error coercion (SPEC §2), JSON lists, the default
-- JSON codec (textutils).
-- Needs: constants. Exports: M.base64Encode, M.base64Decode, M.coercePayload, M.coerceError.

local M, internal = ...
local errorValue = internal.errorValue
local expect = internal.expect

--[[ Built for CraftOS's Lua, where making strings piecewise is slow (SPEC §6): output bytes are
collected as numbers and turned into strings with one string.char per BASE64_GROUP of them, and
the pieces joined with one table.concat. ]]
local BASE64_ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'
local BASE64_GROUP = 1024 -- about this many output bytes per string.char call
local base64Code, base64Value = {}, {}
for i = 1, 64 do
  local c = BASE64_ALPHABET:byte(i)
  base64Code[i - 1] = c
  base64Value[c] = i - 1
end
local PAD = ('='):byte()

local function flushCodes(out, codes, count)
  if count > 0 then out[#out + 1] = string.char(table.unpack(codes, 1, count)) end
  return 0
end

function M.base64Encode(data)
  expect(1, data, 'string')
  local byte, floor = string.byte, math.floor
  local code = base64Code
  local out, codes, k = {}, {}, 0
  local n = #data
  local full = n - n % 3
  for i = 1, full, 3 do
    local a, b, c = byte(data, i, i + 2)
    local v = a * 65536 + b * 256 + c
    codes[k + 1] = code[floor(v / 262144)]
    codes[k + 2] = code[floor(v / 4096) % 64]
    codes[k + 3] = code[floor(v / 64) % 64]
    codes[k + 4] = code[v % 64]
    k = k + 4
    if k >= BASE64_GROUP then k = flushCodes(out, codes, k) end
  end
  local rest = n - full
  if rest > 0 then
    local a, b = byte(data, full + 1, n)
    local v = a * 65536 + (b or 0) * 256
    codes[k + 1] = code[floor(v / 262144)]
    codes[k + 2] = code[floor(v / 4096) % 64]
    codes[k + 3] = rest == 2 and code[floor(v / 64) % 64] or PAD
    codes[k + 4] = PAD
    k = k + 4
  end
  flushCodes(out, codes, k)
  return table.concat(out)
end

-- base64Decode(text) -> bytes | nil, message. Whitespace is ignored; padding is required.
function M.base64Decode(text)
  expect(1, text, 'string')
  if text:find('%s') then text = text:gsub('%s+', '') end
  local n = #text
  if n % 4 ~= 0 then return nil, 'base64 length is not a multiple of 4' end
  local byte, floor = string.byte, math.floor
  local value = base64Value
  local out, codes, k = {}, {}, 0
  for i = 1, n, 4 do
    local a, b, c, d = byte(text, i, i + 3)
    local va, vb, vc, vd = value[a], value[b], value[c], value[d]
    local last = i + 3 == n
    if not (va and vb) then return nil, 'not base64 at byte ' .. i end
    if last and d == PAD then
      if c == PAD then
        codes[k + 1] = floor((va * 262144 + vb * 4096) / 65536)
        k = k + 1
      elseif vc then
        local v = va * 262144 + vb * 4096 + vc * 64
        codes[k + 1] = floor(v / 65536)
        codes[k + 2] = floor(v / 256) % 256
        k = k + 2
      else
        return nil, 'not base64 at byte ' .. (i + 2)
      end
    else
      if not (vc and vd) then return nil, 'not base64 at byte ' .. i end
      local v = va * 262144 + vb * 4096 + vc * 64 + vd
      codes[k + 1] = floor(v / 65536)
      codes[k + 2] = floor(v / 256) % 256
      codes[k + 3] = v % 256
      k = k + 3
    end
    if k >= BASE64_GROUP then k = flushCodes(out, codes, k) end
  end
  flushCodes(out, codes, k)
  return table.concat(out)
end

-- A JSON object decodes to a table with only string keys. Anything else (missing, `[]` which
-- CraftOS decodes to the frozen `textutils.empty_json_array`, a list, a scalar) reads as {}.
-- Always returns a table the caller may modify.
function M.coercePayload(payload)
  if type(payload) ~= 'table' then return {} end
  if next(payload) == nil then return {} end
  for k in pairs(payload) do
    if type(k) ~= 'string' then return {} end
  end
  return payload
end

function M.coerceError(err, fallbackMessage)
  if type(err) == 'table' and type(err.code) == 'string' and err.code ~= '' then
    return errorValue(err.code, type(err.message) == 'string' and err.message or '')
  end
  return errorValue('internal', fallbackMessage or 'request failed without an error')
end

-- An empty list as CraftOS encodes it as a JSON list ([]), where textutils can; {} otherwise,
-- which the gateway reads as an empty list too (SPEC §2, payload coercion).
local function jsonList(list)
  if #list == 0 then
    local tu = rawget(_G, 'textutils')
    if type(tu) == 'table' and type(tu.empty_json_array) == 'table' then return tu.empty_json_array end
  end
  return list
end

local function defaultEncode(value)
  return textutils.serializeJSON(value)
end

local function defaultDecode(text)
  return textutils.unserializeJSON(text)
end

internal.jsonList = jsonList
internal.defaultEncode = defaultEncode
internal.defaultDecode = defaultDecode
