document.querySelectorAll('table.sortable th').forEach(function(th,i){th.addEventListener('click',function(){
var tb=th.closest('table').tBodies[0],rows=Array.from(tb.rows),asc=th.dataset.asc!=='1';th.dataset.asc=asc?'1':'0';
rows.sort(function(a,b){var x=a.cells[i].dataset.v||a.cells[i].textContent,y=b.cells[i].dataset.v||b.cells[i].textContent,
p=parseFloat(x),q=parseFloat(y);var c=(!isNaN(p)&&!isNaN(q))?p-q:x.localeCompare(y);return asc?c:-c;});rows.forEach(function(r){tb.appendChild(r);});});});
(function(){var box=document.getElementById('rank-search');if(!box)return;
var d=JSON.parse(document.getElementById('rank-data').textContent),out=document.getElementById('rank-results'),found=document.getElementById('rank-found');
function cell(tr,t,n){var td=tr.insertCell();td.textContent=t==null?'':t;if(n)td.className='n';}
box.addEventListener('input',function(){var q=box.value.trim().toLowerCase(),hits=[];out.innerHTML='';found.textContent='';if(!q)return;
for(var i=0;i<d.rank.length&&hits.length<50;i++){var p=d.pod[i]<0?'':d.pods[d.pod[i]],n=d.node[i]<0?'':d.nodes[d.node[i]];
if(String(d.rank[i])===q||p.toLowerCase().indexOf(q)>=0||n.toLowerCase().indexOf(q)>=0)hits.push([i,p,n]);}
found.textContent=hits.length>=50?'first 50 matches':hits.length+' match(es)';if(!hits.length)return;
var h=out.createTHead().insertRow();['rank','pod','node','median step ms','kernel time vs peers','slowdown','problems'].forEach(function(t){var th=document.createElement('th');th.textContent=t;h.appendChild(th);});
var b=out.createTBody();hits.forEach(function(x){var i=x[0],r=d.rank[i],tr=b.insertRow();cell(tr,r,1);cell(tr,x[1]);cell(tr,x[2]);cell(tr,d.stepMs[i],1);cell(tr,d.ratio[i],1);
cell(tr,d.slowdown[r],1);cell(tr,d.problems[r]);if(d.slowdown[r]!=null)tr.className='slow';});});})();
