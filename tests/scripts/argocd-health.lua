-- Runs an Argo CD health check on one object, as Argo CD does, and prints "status<TAB>message".
--
--   lua5.4 tests/scripts/argocd-health.lua deploy/argocd/transfer-health.lua < transfer.json
--
-- The object (JSON on stdin) becomes the global `obj`; the script returns {status, message}.
-- Exits non-zero, saying why, when the input is not JSON, the script fails or it returns no
-- status Argo CD knows.
local cjson = require("cjson")

local function die(msg)
  io.stderr:write("argocd-health.lua: ", msg, "\n")
  os.exit(1)
end

-- Argo CD's Lua (gopher-lua) sees a JSON null as nil, and a JSON number as a plain number
-- (3 prints as "3", where Lua 5.4 would print a float 3.0 as "3.0").
local function as_argocd_sees(v)
  if v == cjson.null then
    return nil
  elseif type(v) == "table" then
    local t = {}
    for k, x in pairs(v) do
      t[k] = as_argocd_sees(x)
    end
    return t
  elseif math.type(v) == "float" and math.tointeger(v) ~= nil then
    return math.tointeger(v)
  end
  return v
end

local script = arg[1] or die("usage: argocd-health.lua HEALTH_SCRIPT < OBJECT.json")
local ok, decoded = pcall(cjson.decode, io.read("a"))
if not ok then
  die("stdin is not JSON: " .. tostring(decoded))
end
obj = as_argocd_sees(decoded)

local chunk, err = loadfile(script)
if chunk == nil then
  die("cannot load " .. script .. ": " .. tostring(err))
end
local ran, hs = pcall(chunk)
if not ran then
  die(script .. " failed: " .. tostring(hs))
end
local known = {Healthy = true, Progressing = true, Degraded = true, Suspended = true,
               Missing = true, Unknown = true}
if type(hs) ~= "table" or not known[hs.status] then
  local got = type(hs) == "table" and tostring(hs.status) or type(hs)
  die(script .. " returned no status Argo CD knows (got " .. got .. ")")
end
if hs.message ~= nil and type(hs.message) ~= "string" then
  die(script .. " returned a message that is not a string: " .. tostring(hs.message))
end
io.write(hs.status, "\t", hs.message or "", "\n")
