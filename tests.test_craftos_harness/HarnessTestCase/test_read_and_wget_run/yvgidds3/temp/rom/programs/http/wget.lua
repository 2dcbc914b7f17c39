
local args = { ... }
local run = args[1] == 'run'
if run then table.remove(args, 1) end
local url = table.remove(args, 1)
if not url then print('Usage: wget [run] <url> [args...]') return end
local response, err = http.get(url)
if not response then printError('Failed: ' .. tostring(err)) return end
local body = response.readAll()
response.close()
if run then
  local fn, loadErr = load(body, '=' .. url:match('[^/]*$'), 't', _ENV)
  if not fn then printError(loadErr) return end
  fn(table.unpack(args))
else
  local name = args[1] or url:match('([^/?]+)[^/]*$') or 'download'
  local h = fs.open(shell.resolve(name), 'w')
  h.write(body)
  h.close()
  print('Downloaded as ' .. name)
end
